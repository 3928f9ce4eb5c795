//! `prima keygen`: writes a new cluster key; and the `--key-file`/`--insecure` options with
//! which `prima node` and `prima run --ring` choose how their links are protected.

use std::path::PathBuf;

use anyhow::Context;
use prima_cluster::manifest::LoadedManifest;
use prima_cluster::prp::key::{default_key_path, ClusterKey, LinkSecurity};

#[derive(clap::Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the key (default: ~/.cache/prima/cluster.key); an existing file is
    /// never overwritten.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: KeygenArgs) -> anyhow::Result<()> {
    let path = args.out.unwrap_or_else(default_key_path);
    // A key already there may be the one a whole cluster holds: say which it is, and
    // how to get a new one, rather than only that the file exists.
    if path.exists() {
        let which = match ClusterKey::read(&path) {
            Ok(key) => format!("the cluster key with fingerprint {}", key.fingerprint()),
            Err(e) => format!("not a cluster key ({e})"),
        };
        anyhow::bail!(
            "{} already holds {which}; it is kept (every device of its cluster may use it). \
             To start a new cluster, give --out OTHER_FILE; to replace it, remove the file \
             first and copy the new key to every device",
            path.display()
        );
    }
    let key = ClusterKey::generate();
    key.write_new(&path)?;
    eprintln!(
        "wrote a new cluster key to {} (fingerprint {}); copy it to every device and start each node with --key-file",
        path.display(),
        key.fingerprint()
    );
    Ok(())
}

/// How a device protects its ring links, from the command line.
#[derive(clap::Args, Debug, Clone)]
pub struct KeyArgs {
    /// The cluster key file (`prima keygen`); every device of the ring holds the same
    /// one. Default: ~/.cache/prima/cluster.key, where it exists.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub key_file: Option<PathBuf>,
    /// Plain, unauthenticated links: any machine that reaches this device can drive it
    /// and read its activations. Every device of the ring must say it too.
    #[arg(long)]
    pub insecure: bool,
}

impl KeyArgs {
    /// The security these options ask for; with neither option, the default key file,
    /// and an error saying what to do where there is none.
    pub fn security(&self) -> anyhow::Result<LinkSecurity> {
        if self.insecure {
            return Ok(LinkSecurity::Insecure);
        }
        let path = match &self.key_file {
            Some(path) => path.clone(),
            None => {
                let path = default_key_path();
                anyhow::ensure!(
                    path.exists(),
                    "no cluster key: give --key-file FILE (the head's key, e.g. its {}; `prima keygen` makes one), or --insecure for plain links",
                    path.display()
                );
                path
            }
        };
        let key = ClusterKey::read(&path).context("--key-file")?;
        Ok(LinkSecurity::Key(key))
    }
}

/// A line for the log: how the links are protected (never the key itself).
pub fn describe(security: &LinkSecurity) -> String {
    match security {
        LinkSecurity::Key(key) => format!("links encrypted, cluster key {}", key.fingerprint()),
        LinkSecurity::Insecure => "links PLAIN (--insecure)".into(),
    }
}

/// The security a manifest asks for, and the key file its local nodes are given (`None`:
/// `--insecure`). With no `[security]` key file, the default key file, made on first use:
/// a cluster of local devices then just works, and remote nodes need a copy of it.
pub fn manifest_security(
    manifest: &LoadedManifest,
) -> anyhow::Result<(LinkSecurity, Option<PathBuf>)> {
    let m = &manifest.manifest;
    if m.security.insecure {
        eprintln!("security  links PLAIN ([security] insecure = true)");
        return Ok((LinkSecurity::Insecure, None));
    }
    let (key, path) = match &m.security.key_file {
        Some(file) => {
            let path = manifest.resolve(file);
            let key = ClusterKey::read(&path).with_context(|| {
                format!(
                    "{}: security.key_file (make one with `prima keygen --out {}`)",
                    manifest.path.display(),
                    path.display()
                )
            })?;
            (key, path)
        }
        None => {
            let path = default_key_path();
            let (key, made) = ClusterKey::read_or_create(&path)?;
            let remote = m.devices.iter().any(|d| !d.local && !d.head);
            if made && remote {
                eprintln!(
                    "made a new cluster key at {}: copy it to every remote device and start its node with --key-file",
                    path.display()
                );
            }
            (key, path)
        }
    };
    eprintln!("security  {}", describe(&LinkSecurity::Key(key.clone())));
    Ok((LinkSecurity::Key(key), Some(path)))
}
