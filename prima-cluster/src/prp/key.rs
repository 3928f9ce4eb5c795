//! The cluster key: the 32-byte secret every device of a ring holds, and how it is kept in
//! a file (`prima keygen` writes one). The links between devices are authenticated and
//! encrypted with it ([`super::secure`]); this module only makes, reads and names keys.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngCore;
use sha2::{Digest, Sha256};

/// Bytes in a cluster key.
pub const KEY_BYTES: usize = 32;

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cluster key file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster key file {}: {reason} (expected {} hex digits, as `prima keygen` writes)", path.display(), 2 * KEY_BYTES)]
    Malformed { path: PathBuf, reason: String },
}

/// The cluster's shared secret. Its `Debug` shows the fingerprint, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_BYTES]);

impl ClusterKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> ClusterKey {
        let mut key = [0u8; KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut key);
        ClusterKey(key)
    }

    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// The key as hex digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits; surrounding whitespace is ignored.
    pub fn from_hex(text: &str) -> Result<ClusterKey, String> {
        let text = text.trim();
        if text.len() != 2 * KEY_BYTES {
            return Err(format!("{} characters", text.len()));
        }
        let mut key = [0u8; KEY_BYTES];
        hex::decode_to_slice(text, &mut key).map_err(|e| e.to_string())?;
        Ok(ClusterKey(key))
    }

    /// Reads a key file.
    pub fn read(path: &Path) -> Result<ClusterKey, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ClusterKey::from_hex(&text).map_err(|reason| KeyError::Malformed {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Writes this key to a new file that only its owner may read; an existing file is
    /// never overwritten (it may be the key a whole cluster holds). The file appears whole
    /// or not at all (written aside, then linked into place), so processes racing to make
    /// the default key all end up reading the one that won.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut aside = path.as_os_str().to_owned();
        aside.push(format!(".{}.tmp", std::process::id()));
        let aside = PathBuf::from(aside);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let written = options
            .open(&aside)
            .and_then(|mut file| writeln!(file, "{}", self.to_hex()))
            .and_then(|()| std::fs::hard_link(&aside, path));
        let _ = std::fs::remove_file(&aside);
        written.map_err(io)
    }

    /// The key at `path`, made first (see [`write_new`](Self::write_new)) when there is
    /// no file there yet. `true` when it was made now.
    pub fn read_or_create(path: &Path) -> Result<(ClusterKey, bool), KeyError> {
        match ClusterKey::read(path) {
            Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let key = ClusterKey::generate();
                match key.write_new(path) {
                    Ok(()) => Ok((key, true)),
                    // Another process made it first: theirs is the key.
                    Err(KeyError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        ClusterKey::read(path).map(|k| (k, false))
                    }
                    Err(e) => Err(e),
                }
            }
            other => other.map(|k| (k, false)),
        }
    }

    /// A short public name for the key, to tell keys apart in messages and announcements:
    /// a domain-separated SHA-256, which reveals nothing of the key.
    pub fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"prima cluster key fingerprint\0");
        hash.update(self.0);
        hex::encode(&hash.finalize()[..8])
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey({})", self.fingerprint())
    }
}

/// Where the cluster key lives when none is named: `~/.cache/prima/cluster.key`.
/// `prima apply` makes it on first use; `prima node` and `prima run --ring` use it when
/// it exists.
pub fn default_key_path() -> PathBuf {
    PathBuf::from(crate::profile::home_dir()).join(".cache/prima/cluster.key")
}

/// How a device's ring links are protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSecurity {
    /// Every link is authenticated and encrypted with this key.
    Key(ClusterKey),
    /// Plain links (`--insecure`): anyone who can reach the device can drive it and read
    /// its activations. Only by an explicit choice.
    Insecure,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_bad_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("prima-key-test-{}", std::process::id()));
        let path = dir.join("sub").join("cluster.key");
        let _ = std::fs::remove_dir_all(&dir);
        let (key, made) = ClusterKey::read_or_create(&path).unwrap();
        assert!(made);
        let (again, made) = ClusterKey::read_or_create(&path).unwrap();
        assert!(!made);
        assert_eq!(key, again);
        assert!(key.write_new(&path).is_err(), "an existing key is kept");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "only the owner reads the key: {mode:o}");
        }
        assert!(!format!("{key:?}").contains(&key.to_hex()));

        std::fs::write(&path, "abc\n").unwrap();
        let err = ClusterKey::read(&path).unwrap_err().to_string();
        assert!(
            err.contains("cluster.key") && err.contains("3 characters"),
            "{err}"
        );
        std::fs::write(&path, "zz".repeat(KEY_BYTES)).unwrap();
        let err = ClusterKey::read(&path).unwrap_err().to_string();
        assert!(err.contains("64 hex digits"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
