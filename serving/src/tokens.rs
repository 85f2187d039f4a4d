//! Bearer tokens for the HTTP and gRPC listeners: `[serving] tokens_file`,
//! one token per line (blank lines and `#` comments skipped). The file is
//! read again when it changes (checked at most once a second, when a
//! request comes) and on SIGHUP, so tokens are added and revoked without a
//! restart. Only SHA-256 digests of the tokens are kept; a presented token
//! is hashed and compared with every digest in constant time, and no token
//! is ever logged.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::SetupError;

/// How often a request may make the file be looked at again.
const RECHECK: Duration = Duration::from_secs(1);

/// The accepted tokens.
pub struct Tokens {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    digests: Vec<[u8; 32]>,
    /// The file's modification time and length when read.
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

impl Tokens {
    /// Reads `path` (an unreadable file is an error at start).
    pub fn load(path: &Path) -> Result<Tokens, SetupError> {
        let (digests, stamp) = read(path).map_err(|e| SetupError::TokensFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if digests.is_empty() {
            tracing::warn!(file = %path.display(), "the tokens file holds no token: every request but liveness is refused");
        }
        Ok(Tokens {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                digests,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// Whether `presented` is one of the tokens.
    pub fn allows(&self, presented: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut state = self.lock();
        if state.checked.elapsed() >= RECHECK {
            state.checked = Instant::now();
            if stamp(&self.path) != state.stamp {
                self.reload_locked(&mut state);
            }
        }
        // Every digest compared, each in constant time: the time taken
        // tells nothing of which token (or how much of one) matched.
        state
            .digests
            .iter()
            .fold(false, |found, d| found | same(d, &digest))
    }

    /// Reads the file again now (SIGHUP).
    pub fn reload(&self) {
        let mut state = self.lock();
        self.reload_locked(&mut state);
    }

    /// How many tokens are accepted now.
    pub fn count(&self) -> usize {
        self.lock().digests.len()
    }

    fn reload_locked(&self, state: &mut State) {
        match read(&self.path) {
            Ok((digests, stamp)) => {
                tracing::info!(file = %self.path.display(), tokens = digests.len(), "tokens read");
                state.digests = digests;
                state.stamp = stamp;
            }
            // Keeping the old tokens: a file caught half-written, or
            // removed by mistake, must not lock everyone out (or in).
            Err(e) => tracing::warn!(
                file = %self.path.display(),
                "tokens file: {e}; the tokens read before stay in force"
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Read = (Vec<[u8; 32]>, Option<(SystemTime, u64)>);

fn read(path: &Path) -> Result<Read, std::io::Error> {
    let stamp = stamp(path);
    let text = std::fs::read_to_string(path)?;
    let digests = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|t| Sha256::digest(t.as_bytes()).into())
        .collect();
    Ok((digests, stamp))
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// `a == b` in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

/// The token of an `Authorization: Bearer TOKEN` header value.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let scheme = b"bearer ";
    if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return None;
    }
    let token = value[scheme.len()..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.txt");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn accepts_listed_tokens_only() {
        let (_dir, path) = file("# ops team\nalpha-123\n\n  beta  \n");
        let tokens = Tokens::load(&path).unwrap();
        assert_eq!(tokens.count(), 2);
        assert!(tokens.allows(b"alpha-123"));
        assert!(tokens.allows(b"beta"));
        for wrong in [
            &b"alpha-12"[..],
            b"alpha-1234",
            b"",
            b"# ops team",
            b"ALPHA-123",
        ] {
            assert!(!tokens.allows(wrong), "{wrong:?}");
        }
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_old_tokens() {
        let (_dir, path) = file("old\n");
        let tokens = Tokens::load(&path).unwrap();
        std::fs::write(&path, "new-token\n").unwrap();
        tokens.reload();
        assert!(tokens.allows(b"new-token") && !tokens.allows(b"old"));
        std::fs::remove_file(&path).unwrap();
        tokens.reload();
        assert!(tokens.allows(b"new-token"), "kept after the file vanished");
    }

    #[test]
    fn a_missing_file_fails_at_start() {
        let err = Tokens::load(Path::new("/nonexistent/tokens.txt"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("tokens_file /nonexistent/tokens.txt"), "{err}");
    }

    #[test]
    fn bearer_header_values() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer"), None);
    }
}
