//! `prima plugins`: what the loader finds, and why a plugin would be refused.

use prima_abi::backend::BackendConfig;
use prima_core::plugin::{discover, load_backend, plugin_dirs};

pub fn run() -> anyhow::Result<()> {
    let dirs = plugin_dirs();
    println!(
        "plugin directories: {}",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let found = discover();
    if found.is_empty() {
        println!("no plugins found");
        return Ok(());
    }
    for p in found {
        let kind = p.kind.map(|k| k.name()).unwrap_or("unknown");
        let abi = p
            .abi_version
            .map(|v| format!("abi v{v}"))
            .unwrap_or_else(|| "abi ?".into());
        let name = p.name.as_deref().unwrap_or("?");
        let version = p.version.as_deref().unwrap_or("?");
        match (&p.refused, &p.unavailable) {
            (None, None) if !p.covers.is_empty() => println!(
                "{kind:<9} {name:<8} {version:<8} {abi:<7} {} — covers {}",
                p.path.display(),
                p.covers.join(", ")
            ),
            (None, None) => match &p.gpu_memory {
                Some(m) => {
                    println!(
                        "{kind:<9} {name:<8} {version:<8} {abi:<7} {} — GPU, {:.1} GiB {} ({:.1} GiB free)",
                        p.path.display(),
                        m.total_bytes as f64 / (1u64 << 30) as f64,
                        if m.unified { "unified memory" } else { "VRAM" },
                        m.free_bytes as f64 / (1u64 << 30) as f64,
                    );
                    // Which GPU and API: only an opened backend can say.
                    match load_backend(Some(name), BackendConfig { threads: 0 }) {
                        Ok(b) => println!("{:<37}{}", "", b.backend.describe()),
                        Err(e) => println!("{:<37}cannot be opened: {e}", ""),
                    }
                }
                None => println!(
                    "{kind:<9} {name:<8} {version:<8} {abi:<7} {}",
                    p.path.display()
                ),
            },
            (None, Some(why)) => println!(
                "{kind:<9} {name:<8} {version:<8} {abi:<7} {} — unavailable: {why}",
                p.path.display()
            ),
            (Some(why), _) => println!("refused   {} — {why}", p.path.display()),
        }
    }
    Ok(())
}
