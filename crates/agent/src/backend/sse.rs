//! A bounded server-sent-events decoder (the WHATWG "event stream" format, as OpenAI's
//! streaming chat completions use it: `data: {json}` events separated by blank lines, ended by
//! `data: [DONE]`). Pure: bytes in, complete events' `data` out, in pieces of any size; a line
//! longer than `max_line` or an event larger than `max_event` is an error, so a hostile upstream
//! cannot grow memory without bound.

/// Why the stream cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("upstream stream line longer than {0} bytes")]
    LineTooLong(usize),
    #[error("upstream stream event larger than {0} bytes")]
    EventTooLarge(usize),
}

/// Incremental decoder; feed it with [`SseDecoder::push`], then [`SseDecoder::finish`].
#[derive(Debug, Clone)]
pub struct SseDecoder {
    max_line: usize,
    max_event: usize,
    /// The current, unterminated line.
    line: Vec<u8>,
    /// The current event's `data`, lines joined by `\n`.
    data: Option<String>,
    /// The previous chunk ended in `\r`: a `\n` starting the next one belongs to it.
    after_cr: bool,
}

impl SseDecoder {
    pub fn new(max_line: usize, max_event: usize) -> SseDecoder {
        SseDecoder { max_line, max_event, line: Vec::new(), data: None, after_cr: false }
    }

    /// Decodes `bytes`, returning the `data` of each event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, SseError> {
        let mut events = Vec::new();
        for &b in bytes {
            let was_cr = std::mem::take(&mut self.after_cr);
            match b {
                b'\n' if was_cr => {}
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&line)? {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= self.max_line {
                        return Err(SseError::LineTooLong(self.max_line));
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(events)
    }

    /// The end of the stream: an event not yet ended by a blank line is dispatched (servers
    /// that close right after `data: [DONE]\n` are common).
    pub fn finish(&mut self) -> Result<Option<String>, SseError> {
        let line = std::mem::take(&mut self.line);
        let last = if line.is_empty() { None } else { self.line_done(&line)? };
        Ok(last.or_else(|| self.data.take()))
    }

    fn line_done(&mut self, line: &[u8]) -> Result<Option<String>, SseError> {
        if line.is_empty() {
            return Ok(self.data.take());
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (&*line, ""),
        };
        // Comments (`: keep-alive`), `event:`, `id:` and `retry:` carry nothing for us.
        if field == "data" {
            let data = self.data.get_or_insert_with(String::new);
            let extra = usize::from(!data.is_empty());
            if data.len() + extra + value.len() > self.max_event {
                self.data = None;
                return Err(SseError::EventTooLarge(self.max_event));
            }
            if extra == 1 {
                data.push('\n');
            }
            data.push_str(value);
        }
        Ok(None)
    }
}

/// Decodes a whole stream at once (tests, fuzzing).
pub fn decode_all(bytes: &[u8], max_line: usize, max_event: usize) -> Result<Vec<String>, SseError> {
    let mut d = SseDecoder::new(max_line, max_event);
    let mut events = d.push(bytes)?;
    events.extend(d.finish()?);
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn openai_stream() {
        let s = b": keep-alive\n\ndata: {\"a\":1}\n\nevent: x\r\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        assert_eq!(decode_all(s, 64, 64).unwrap(), vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
        // Multi-line data, no space after the colon, and a stream cut without the blank line.
        assert_eq!(decode_all(b"data:a\ndata: b\n\ndata: [DONE]", 64, 64).unwrap(), vec!["a\nb", "[DONE]"]);
        assert_eq!(decode_all(b"data: x\n", 64, 64).unwrap(), vec!["x"]);
        assert!(decode_all(b"\n\n: c\n\n", 64, 64).unwrap().is_empty());
    }

    #[test]
    fn bounds() {
        assert_eq!(decode_all(&[b'a'; 65], 64, 1024), Err(SseError::LineTooLong(64)));
        assert_eq!(decode_all(b"data: 12345\ndata: 12345\n\n", 64, 8), Err(SseError::EventTooLarge(8)));
        assert_eq!(decode_all(b"data: 1234\ndata: 123\n\n", 64, 8), Ok(vec!["1234\n123".to_string()]));
    }

    proptest! {
        /// Any split of the input decodes as the whole does; nothing panics; events stay bounded.
        #[test]
        fn chunking_does_not_matter(bytes in proptest::collection::vec(any::<u8>(), 0..400), cut in 0usize..400) {
            let whole = decode_all(&bytes, 32, 48);
            let cut = cut.min(bytes.len());
            let mut d = SseDecoder::new(32, 48);
            let pieces = d.push(&bytes[..cut]).and_then(|mut a| {
                a.extend(d.push(&bytes[cut..])?);
                a.extend(d.finish()?);
                Ok(a)
            });
            prop_assert_eq!(&whole, &pieces);
            if let Ok(events) = whole {
                prop_assert!(events.iter().all(|e| e.len() <= 48 * 3));
            }
        }
    }
}
