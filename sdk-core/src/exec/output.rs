//! What collecting an exec yields, and the collector that enforces the cap.

use std::fmt;

use super::ExecEvent;
use crate::error::Error;

/// What a buffered exec collected.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything written to stdout.
    pub stdout: Vec<u8>,
    /// Everything written to stderr.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
}

impl ExecOutput {
    /// Whether the exit code is 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl fmt::Debug for ExecOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecOutput")
            .field("stdout_len", &self.stdout.len())
            .field("stderr_len", &self.stderr.len())
            .field("exit_code", &self.exit_code)
            .finish()
    }
}

/// Collects output up to a cap on stdout and stderr together: what
/// buffered exec uses, and what collecting a stream uses in every binding.
#[derive(Debug)]
pub struct OutputCollector {
    limit: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl OutputCollector {
    /// An empty collector that holds at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// The cap in bytes (stdout and stderr together).
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn total(&self) -> usize {
        self.stdout.len() + self.stderr.len()
    }

    /// Adds an event; `Ok(Some(output))` at the exit event. Fails with
    /// `output_limit` when a chunk would take the output past the cap (the
    /// caller then drops the stream, which cancels the command).
    pub fn push(&mut self, event: ExecEvent) -> Result<Option<ExecOutput>, Error> {
        let total = self.total();
        let (buffer, chunk) = match event {
            ExecEvent::Stdout(chunk) => (&mut self.stdout, chunk),
            ExecEvent::Stderr(chunk) => (&mut self.stderr, chunk),
            ExecEvent::Exit(exit_code) => {
                return Ok(Some(ExecOutput {
                    stdout: std::mem::take(&mut self.stdout),
                    stderr: std::mem::take(&mut self.stderr),
                    exit_code,
                }));
            }
        };
        if total.saturating_add(chunk.len()) > self.limit {
            return Err(Error::OutputLimit { limit: self.limit });
        }
        buffer.extend_from_slice(&chunk);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn output_cap_counts_stdout_and_stderr_together() {
        let mut c = OutputCollector::new(10);
        assert!(
            c.push(ExecEvent::Stdout(Bytes::from_static(b"12345")))
                .unwrap()
                .is_none()
        );
        assert!(
            c.push(ExecEvent::Stderr(Bytes::from_static(b"12345")))
                .unwrap()
                .is_none()
        );
        // Exactly at the cap is fine; one more byte is not.
        let err = c
            .push(ExecEvent::Stdout(Bytes::from_static(b"x")))
            .unwrap_err();
        assert_eq!(err.code(), "output_limit");
        assert!(err.to_string().contains("10 bytes"));
        let mut c = OutputCollector::new(10);
        c.push(ExecEvent::Stdout(Bytes::from_static(b"abc")))
            .unwrap();
        c.push(ExecEvent::Stderr(Bytes::from_static(b"de")))
            .unwrap();
        let output = c.push(ExecEvent::Exit(2)).unwrap().unwrap();
        assert_eq!(output.stdout, b"abc");
        assert_eq!(output.stderr, b"de");
        assert_eq!(output.exit_code, 2);
        assert!(!output.success());
    }
}
