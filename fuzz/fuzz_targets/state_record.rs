//! `gateway_state.json` (docs/protocol.md §2.2), parsed the way `records::read_state` does
//! (`fsio::read_json`): any bytes give a value or an error, and a record that parses
//! serializes and reads back unchanged.
#![no_main]

use gatewarden_lifecycle::fsio::parse_json_value;
use gatewarden_lifecycle::records::StateRecord;
use libfuzzer_sys::fuzz_target;

fn parse(bytes: &[u8]) -> Result<StateRecord, String> {
    parse_json_value(bytes).and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
}

fuzz_target!(|data: &[u8]| {
    let Ok(state) = parse(data) else { return };
    let _ = state.gateway_state.to_string();
    let _ = state.record.identity();
    let written = serde_json::to_vec(&state).expect("a parsed state serializes");
    assert_eq!(parse(&written).as_ref(), Ok(&state), "write/read round trip");
});
