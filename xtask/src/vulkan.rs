//! Mesa's software Vulkan driver (lavapipe), on which the wgpu backend's tests run
//! (`plugins/backend-metal/tests/lavapipe.rs`): `cargo xtask setup` installs it where it
//! can (root on Debian or Ubuntu, with apt-get), and `cargo xtask test` requires it
//! (`PRIMA_REQUIRE_VULKAN=1`) wherever it is installed. Failing to install it is a
//! warning: the wgpu tests then skip, and the test summary says so.

use std::path::Path;

/// The Debian packages: the Vulkan loader and Mesa's drivers, lavapipe among them.
const PACKAGES: [&str; 2] = ["libvulkan1", "mesa-vulkan-drivers"];

/// Where the loader and lavapipe's ICD manifest live on Debian and Ubuntu (any
/// architecture's multiarch directory).
fn loader_present() -> bool {
    ["/usr/lib", "/usr/lib64", "/lib"].iter().any(|dir| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.path().join("libvulkan.so.1").exists() || e.file_name() == "libvulkan.so.1"
            })
        })
    })
}

fn icd_present() -> bool {
    std::fs::read_dir("/usr/share/vulkan/icd.d").is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("lvp_icd"))
    })
}

/// Whether the Vulkan loader and lavapipe are installed.
pub fn lavapipe_installed() -> bool {
    loader_present() && icd_present()
}

/// Installs lavapipe with apt-get where it is missing and this is root on Debian/Ubuntu;
/// otherwise, or on failure, prints a warning and carries on.
pub fn ensure_lavapipe() {
    if lavapipe_installed() {
        return;
    }
    // SAFETY: geteuid only reads the process's effective user id.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/etc/debian_version").exists() {
        eprintln!(
            "warning: Mesa's software Vulkan driver (lavapipe) is missing; the wgpu backend's \
             tests will skip. Install `{}` (Debian/Ubuntu) to run them.",
            PACKAGES.join(" ")
        );
        return;
    }
    eprintln!(
        "installing lavapipe (apt-get install {})",
        PACKAGES.join(" ")
    );
    let ok = crate::shell::apt_install(&PACKAGES);
    if !ok || !lavapipe_installed() {
        eprintln!(
            "warning: could not install lavapipe ({}); the wgpu backend's tests will skip",
            PACKAGES.join(" ")
        );
    }
}
