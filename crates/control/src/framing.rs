//! Newline-delimited JSON with a size cap, over any blocking byte stream.

use std::io::{self, BufRead, Write};

use serde::{Serialize, de::DeserializeOwned};

use crate::MAX_LINE;

/// Reads one line (without the newline). `Ok(None)` at end of stream.
pub fn read_line<R: BufRead>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let n = io::Read::take(&mut *r, MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_LINE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "control line longer than 64 KiB"));
    }
    Ok(Some(buf))
}

pub fn decode<T: DeserializeOwned>(line: &[u8]) -> io::Result<T> {
    serde_json::from_slice(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut v = serde_json::to_vec(msg).map_err(io::Error::other)?;
    v.push(b'\n');
    Ok(v)
}

pub fn write_msg<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg)?)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_caps() {
        let mut input = io::Cursor::new(b"{\"a\":1}\nlast".to_vec());
        assert_eq!(read_line(&mut input).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(read_line(&mut input).unwrap().unwrap(), b"last");
        assert!(read_line(&mut input).unwrap().is_none());
        let mut huge = io::Cursor::new(vec![b'x'; MAX_LINE + 10]);
        assert!(read_line(&mut huge).is_err());
    }
}
