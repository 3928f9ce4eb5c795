//! The few Hugging Face Hub calls a pull needs, over plain HTTP(S) (`ureq`):
//!
//! - `GET {endpoint}/api/models/{repo}/revision/main` → `sha`, the commit;
//! - `GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true` → each file's path,
//!   size and, for LFS files (every GGUF), `lfs.oid`: the SHA-256 of its bytes;
//! - `GET {endpoint}/{repo}/resolve/{commit}/{path}` with `Range: bytes=N-` → the bytes
//!   from N on (206), or all of them (200) from a server that ignores ranges.
//!
//! Why not the `hf-hub` crate: 0.4 brings a second HTTP stack (ureq 2 with OpenSSL) and 1.0
//! reqwest, tokio and hf-xet, and neither checks a download against the Hub's SHA-256;
//! resuming and checking are the point here, and ureq is already in the tree.

use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::cache::{is_commit, is_sha256};
use super::name::RepoFile;

/// The Hub's address (`HF_ENDPOINT`, as huggingface_hub and llama.cpp read it).
pub const ENDPOINT_ENV: &str = "HF_ENDPOINT";
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Why a call to the Hub failed: it could not be reached (the cache may still serve), or
/// it answered with something other than what was asked.
#[derive(Debug)]
pub enum HubError {
    Unreachable {
        url: String,
        message: String,
    },
    Status {
        url: String,
        status: u16,
        body: String,
    },
    Invalid {
        url: String,
        message: String,
    },
}

impl std::fmt::Display for HubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HubError::Unreachable { url, message } => write!(f, "cannot reach {url}: {message}"),
            HubError::Status { url, status, body } if body.is_empty() => {
                write!(f, "{url}: HTTP {status}")
            }
            HubError::Status { url, status, body } => write!(f, "{url}: HTTP {status}: {body}"),
            HubError::Invalid { url, message } => write!(f, "{url}: {message}"),
        }
    }
}

impl std::error::Error for HubError {}

pub struct Hub {
    endpoint: String,
    agent: ureq::Agent,
    /// `HF_TOKEN`, for gated and private repositories.
    token: Option<String>,
}

/// How a download ended when it did not complete.
pub enum Interrupted {
    /// The connection broke (or the server stopped sending) after `have` bytes: resumable.
    At { have: u64, message: String },
    /// Anything else (the disk, a refused range, a wrong size, a wrong SHA-256).
    Failed(anyhow::Error),
}

impl Hub {
    pub fn from_env() -> Hub {
        let endpoint = std::env::var(ENDPOINT_ENV)
            .ok()
            .filter(|e| !e.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer fails (and is resumed) instead of hanging.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .user_agent(format!("prima/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            agent,
            token: std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn get(
        &self,
        url: &str,
        range_from: u64,
    ) -> Result<ureq::http::Response<ureq::Body>, HubError> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", format!("bytes={range_from}-"));
        }
        req.call().map_err(|e| HubError::Unreachable {
            url: url.to_string(),
            message: e.to_string(),
        })
    }

    fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, HubError> {
        let mut resp = self.get(url, 0)?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp
                .body_mut()
                .with_config()
                .limit(4096)
                .read_to_string()
                .unwrap_or_default();
            return Err(HubError::Status {
                url: url.to_string(),
                status,
                body: hub_message(&body),
            });
        }
        resp.body_mut()
            .with_config()
            .limit(64 << 20)
            .read_json()
            .map_err(|e| HubError::Invalid {
                url: url.to_string(),
                message: format!("unexpected answer: {e}"),
            })
    }

    /// The commit the repository's `main` branch points at.
    pub fn main_commit(&self, repo: &str) -> Result<String, HubError> {
        #[derive(Deserialize)]
        struct Revision {
            sha: String,
        }
        let url = format!("{}/api/models/{repo}/revision/main", self.endpoint);
        let r: Revision = self.get_json(&url)?;
        if !is_commit(&r.sha) {
            return Err(HubError::Invalid {
                url,
                message: format!("'{}' is not a commit hash", r.sha),
            });
        }
        Ok(r.sha)
    }

    /// Every file of the repository at `commit`, with the SHA-256 of LFS files.
    pub fn files(&self, repo: &str, commit: &str) -> Result<Vec<RepoFile>, HubError> {
        #[derive(Deserialize)]
        struct Lfs {
            oid: String,
            size: u64,
        }
        #[derive(Deserialize)]
        struct Entry {
            #[serde(rename = "type")]
            kind: String,
            path: String,
            #[serde(default)]
            size: u64,
            lfs: Option<Lfs>,
        }
        let url = format!(
            "{}/api/models/{repo}/tree/{commit}?recursive=true",
            self.endpoint
        );
        let entries: Vec<Entry> = self.get_json(&url)?;
        let mut files = Vec::new();
        for e in entries.into_iter().filter(|e| e.kind == "file") {
            // A path that could leave the snapshot directory is not taken.
            if e.path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
                || e.path.contains('\\')
            {
                continue;
            }
            let (size, sha256) = match e.lfs {
                Some(l) if is_sha256(&l.oid) => (l.size, Some(l.oid.to_ascii_lowercase())),
                _ => (e.size, None),
            };
            files.push(RepoFile {
                path: e.path,
                size,
                sha256,
            });
        }
        Ok(files)
    }

    pub fn file_url(&self, repo: &str, commit: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{commit}/{path}", self.endpoint)
    }

    /// One attempt at bringing `part` up to `file.size` bytes from the Hub, from its
    /// current length on; `hasher` holds the SHA-256 state of the bytes already in it and
    /// `progress` is told the length after every write.
    pub fn download_into(
        &self,
        url: &str,
        file: &RepoFile,
        part: &Path,
        hasher: &mut Sha256,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), Interrupted> {
        let failed = |e: anyhow::Error| Interrupted::Failed(e);
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(part)
            .map_err(|e| failed(anyhow::anyhow!("{}: {e}", part.display())))?;
        let mut have = out
            .metadata()
            .map_err(|e| failed(anyhow::anyhow!("{}: {e}", part.display())))?
            .len();
        if have == file.size {
            return Ok(());
        }
        let resp = self.get(url, have).map_err(|e| Interrupted::At {
            have,
            message: e.to_string(),
        })?;
        match resp.status().as_u16() {
            206 => {
                let start = resp
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if start != Some(have) {
                    return Err(failed(anyhow::anyhow!(
                        "{url}: asked for the bytes from {have} on, got a range starting at {start:?}"
                    )));
                }
            }
            200 => {
                // The server sends the whole file: start over.
                if have > 0 {
                    out.set_len(0)
                        .and_then(|_| out.rewind())
                        .map_err(|e| failed(anyhow::anyhow!("{}: {e}", part.display())))?;
                    *hasher = Sha256::new();
                    have = 0;
                }
            }
            status => {
                let mut resp = resp;
                let body = resp
                    .body_mut()
                    .with_config()
                    .limit(4096)
                    .read_to_string()
                    .unwrap_or_default();
                return Err(failed(anyhow::anyhow!(
                    "{url}: HTTP {status}{}",
                    match hub_message(&body) {
                        m if m.is_empty() => String::new(),
                        m => format!(": {m}"),
                    }
                )));
            }
        }
        progress(have);
        let mut body = resp.into_body().into_reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Interrupted::At {
                        have,
                        message: e.to_string(),
                    })
                }
            };
            if have + n as u64 > file.size {
                return Err(failed(anyhow::anyhow!(
                    "{}: the server sent more than the {} bytes the Hub lists",
                    file.path,
                    file.size
                )));
            }
            out.write_all(&buf[..n])
                .map_err(|e| failed(anyhow::anyhow!("{}: {e}", part.display())))?;
            hasher.update(&buf[..n]);
            have += n as u64;
            progress(have);
        }
        out.sync_all()
            .map_err(|e| failed(anyhow::anyhow!("{}: {e}", part.display())))?;
        if have < file.size {
            return Err(Interrupted::At {
                have,
                message: "the connection closed early".into(),
            });
        }
        Ok(())
    }
}

/// The Hub's `{"error": "..."}`, else the body's first line.
fn hub_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct E {
        error: String,
    }
    match serde_json::from_str::<E>(body) {
        Ok(e) => e.error,
        Err(_) => body
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect(),
    }
}

/// The SHA-256 state of the first bytes of a file (a partial download resumed).
pub fn hash_prefix(path: &Path) -> std::io::Result<(Sha256, u64)> {
    let mut hasher = Sha256::new();
    let mut n = 0;
    match std::fs::File::open(path) {
        Ok(mut f) => {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let k = f.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                hasher.update(&buf[..k]);
                n += k as u64;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok((hasher, n))
}
