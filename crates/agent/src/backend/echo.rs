//! `echo`: the embedded default backend.
//!
//! The reply is exactly the message text, byte for byte (an empty message gets an empty reply).
//! With `delay_ms` the reply comes after that long, and the wait is cancellable. Streaming sends
//! the text word by word, each word with the whitespace that follows it, so the chunks
//! concatenate to the reply.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Agent, AgentError, AgentFuture, AgentReply, AgentRequest, send_chunk, with_timeout};

/// Replies with the message text.
#[derive(Debug, Clone)]
pub struct EchoAgent {
    delay: Duration,
    timeout: Duration,
}

impl EchoAgent {
    pub fn new(delay: Duration, timeout: Duration) -> Self {
        EchoAgent { delay, timeout }
    }

    async fn go(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        with_timeout(self.timeout, &cancel, |cancel| async move {
            if !self.delay.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(self.delay) => {}
                    () = cancel.cancelled() => return Err(AgentError::Cancelled),
                }
            }
            if cancel.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            if let Some(chunks) = chunks {
                for word in req.text.split_inclusive(char::is_whitespace) {
                    send_chunk(&chunks, &cancel, word.to_string()).await?;
                }
            }
            Ok(AgentReply { text: req.text, ..AgentReply::default() })
        })
        .await
    }
}

impl Agent for EchoAgent {
    fn name(&self) -> &str {
        "echo"
    }

    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_> {
        Box::pin(self.go(req, cancel, chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(text: &str) -> AgentRequest {
        AgentRequest {
            run_id: "r".into(),
            chat_id: "c".into(),
            user_id: "u".into(),
            text: text.into(),
            history: Vec::new(),
            platform: None,
            session_started: None,
            http_conversation: false,
            attachments: Vec::new(),
        }
    }

    #[tokio::test]
    async fn replies_with_the_text() {
        let a = EchoAgent::new(Duration::ZERO, Duration::from_secs(5));
        let r = a.run(req("héllo  world\n"), CancellationToken::new()).await;
        assert_eq!(r.unwrap().text, "héllo  world\n");
        assert_eq!(a.run(req(""), CancellationToken::new()).await.unwrap().text, "");
    }

    #[tokio::test]
    async fn streams_words_that_concatenate_to_the_reply() {
        let a = EchoAgent::new(Duration::ZERO, Duration::from_secs(5));
        let (tx, mut rx) = mpsc::channel(16);
        let r = a.run_streaming(req("one two  three"), CancellationToken::new(), tx).await.unwrap();
        let mut got = Vec::new();
        while let Some(c) = rx.recv().await {
            got.push(c);
        }
        assert_eq!(got, vec!["one ", "two ", " ", "three"]);
        assert_eq!(got.concat(), r.text);
    }

    #[tokio::test]
    async fn delay_is_cancellable() {
        let a = EchoAgent::new(Duration::from_secs(3600), Duration::from_secs(7200));
        let cancel = CancellationToken::new();
        let run = a.run(req("x"), cancel.clone());
        cancel.cancel();
        let r = tokio::time::timeout(Duration::from_secs(10), run).await;
        assert_eq!(r.expect("cancel must be prompt"), Err(AgentError::Cancelled));
    }

    #[tokio::test]
    async fn delay_longer_than_timeout_times_out() {
        let a = EchoAgent::new(Duration::from_secs(3600), Duration::from_millis(10));
        let r = a.run(req("x"), CancellationToken::new()).await;
        assert_eq!(r, Err(AgentError::Timeout(Duration::from_millis(10))));
    }

    #[tokio::test]
    async fn dropped_receiver_does_not_stop_the_run() {
        let a = EchoAgent::new(Duration::ZERO, Duration::from_secs(5));
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let r = a.run_streaming(req("a b c"), CancellationToken::new(), tx).await;
        assert_eq!(r.unwrap().text, "a b c");
    }
}
