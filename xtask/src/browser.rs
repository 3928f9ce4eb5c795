//! Headless Chromium and chromedriver, in which `prima-cli/tests/web_page.rs` drives the
//! web page: `cargo xtask test` installs Debian's `chromium` and `chromium-driver` where
//! they are missing and this is root on Debian or Ubuntu (apt-get), and otherwise
//! reports the step skipped.

use std::path::Path;

/// The Debian packages.
const PACKAGES: [&str; 2] = ["chromium", "chromium-driver"];

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// Whether a Chromium and its chromedriver are installed.
pub fn installed() -> bool {
    on_path("chromedriver") && (on_path("chromium") || on_path("chromium-browser"))
}

/// Installs them with apt-get where they are missing and this is root on Debian/Ubuntu;
/// `Err`: why they are still missing.
pub fn ensure() -> Result<(), String> {
    if installed() {
        return Ok(());
    }
    // SAFETY: geteuid only reads the process's effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/etc/debian_version").exists() {
        return Err(format!(
            "chromium and chromedriver are missing (install `{}` on Debian/Ubuntu, as root)",
            PACKAGES.join(" ")
        ));
    }
    eprintln!(
        "installing a headless browser (apt-get install {})",
        PACKAGES.join(" ")
    );
    let ok = crate::shell::apt_install(&PACKAGES);
    if ok && installed() {
        Ok(())
    } else {
        Err(format!("apt-get could not install {}", PACKAGES.join(" ")))
    }
}
