//! The limits this process's control groups put on it: memory (limit and the usage that
//! counts against it) and CPU time (a quota per period), in cgroup v1 and v2.
//!
//! A node in a container, a systemd slice or an emulated home-lab device has less than the
//! host's /proc/meminfo and CPU count say. This module only reads; it never creates, moves
//! into or changes a cgroup (the home-lab emulation that does lives in `xtask/`).
//!
//! Every reader takes the filesystem root and the texts of /proc/self/cgroup and
//! /proc/self/mountinfo as parameters, so tests run on recorded trees under a temp dir. A
//! missing or garbled file means "no limit there", never an error: a device whose cgroup
//! cannot be read plans with the host's figures, as it did before.

mod cpu;
mod memory;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use cpu::{cpu_quota, parse_cpu_max, CpuQuota};
pub use memory::{memory_limit, memory_limit_over, MemoryLimit};

/// Which cgroup interface a limit was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn name(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "cgroup v1",
            CgroupVersion::V2 => "cgroup v2",
        }
    }
}

/// One cgroup on the way from this process's own up to the root of its hierarchy.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupDir {
    pub version: CgroupVersion,
    /// The cgroup's path as /proc/self/cgroup names it (e.g. `/prima-dev1`).
    pub path: String,
    /// Where its control files are.
    pub dir: PathBuf,
}

/// The texts that say where this process's cgroups are, and the root they are under.
#[derive(Debug, Clone)]
pub struct CgroupSources {
    /// /proc/self/cgroup.
    pub proc_cgroup: String,
    /// /proc/self/mountinfo.
    pub mountinfo: String,
    /// The filesystem root the mount points are under: `/`, or a test's temp dir.
    pub root: PathBuf,
}

impl CgroupSources {
    /// This process's, read from /proc (empty texts where they cannot be read: no limits).
    pub fn this_process() -> CgroupSources {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        CgroupSources {
            proc_cgroup: read("/proc/self/cgroup"),
            mountinfo: read("/proc/self/mountinfo"),
            root: PathBuf::from("/"),
        }
    }

    /// The cgroups whose `controller` files bear on this process, own cgroup first and
    /// then each ancestor up to the hierarchy's root: the v2 chain (if the unified
    /// hierarchy is mounted) followed by the v1 chain (if `controller` has a v1 mount).
    /// Hybrid hosts have both; a v2 cgroup without the controller enabled simply has no
    /// files for it.
    pub fn chain(&self, controller: &str) -> Vec<CgroupDir> {
        let mut dirs = Vec::new();
        let mounts = parse_mountinfo(&self.mountinfo);
        for line in self.proc_cgroup.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let mount = if id == "0" && controllers.is_empty() {
                mounts.iter().find(|m| m.fstype == "cgroup2")
            } else if controllers.split(',').any(|c| c == controller) {
                mounts.iter().find(|m| {
                    m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == controller)
                })
            } else {
                None
            };
            let Some(mount) = mount else { continue };
            let version = if mount.fstype == "cgroup2" {
                CgroupVersion::V2
            } else {
                CgroupVersion::V1
            };
            dirs.extend(ancestors(version, path, mount, &self.root));
        }
        // v2 first: its limits are the kernel's current interface.
        dirs.sort_by_key(|d| d.version == CgroupVersion::V1);
        dirs
    }
}

/// A cgroup filesystem mount from mountinfo.
#[derive(Debug)]
struct CgroupMount<'a> {
    /// The cgroup the mount shows at its mount point (`/` unless the host bind-mounted a
    /// sub-tree, as Docker does without a cgroup namespace).
    root: &'a str,
    mount_point: &'a str,
    fstype: &'a str,
    super_options: &'a str,
}

/// The cgroup mounts in mountinfo text: `id parent maj:min root mount-point options
/// [optional fields…] - fstype source super-options`.
fn parse_mountinfo(text: &str) -> Vec<CgroupMount<'_>> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dash = fields.iter().position(|&f| f == "-")?;
            let fstype = *fields.get(dash + 1)?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                root: fields.get(3)?,
                mount_point: fields.get(4)?,
                fstype,
                super_options: fields.get(dash + 3).copied().unwrap_or(""),
            })
        })
        .collect()
}

/// `path`'s cgroup and its ancestors visible under `mount`, own first.
fn ancestors(
    version: CgroupVersion,
    path: &str,
    mount: &CgroupMount<'_>,
    root: &Path,
) -> Vec<CgroupDir> {
    // Below the mount's own root; a path outside it (another namespace's view) is taken
    // as it stands and simply finds no files if it is not there.
    let relative = match mount.root {
        "/" => path,
        r => path.strip_prefix(r).unwrap_or(path),
    };
    let base = root.join(mount.mount_point.trim_start_matches('/'));
    let parts: Vec<&str> = relative.split('/').filter(|p| !p.is_empty()).collect();
    (0..=parts.len())
        .rev()
        .map(|depth| {
            let rel = parts[..depth].join("/");
            let mut cgroup_path = mount.root.trim_end_matches('/').to_string();
            cgroup_path.push('/');
            cgroup_path.push_str(&rel);
            if cgroup_path.len() > 1 {
                cgroup_path = cgroup_path.trim_end_matches('/').to_string();
            }
            CgroupDir {
                version,
                path: cgroup_path,
                dir: if rel.is_empty() {
                    base.clone()
                } else {
                    base.join(&rel)
                },
            }
        })
        .collect()
}

/// A control file's content, trimmed; `None` when it is missing or unreadable.
fn read_control(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .map(|s| s.trim().to_string())
}

/// A `key value` line's value from a flat-keyed file such as memory.stat.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
pub(crate) mod testtree {
    //! Recorded cgroup trees under a temp dir, for the readers' tests.
    use std::path::{Path, PathBuf};

    /// A fresh temp dir, removed on drop.
    pub struct Tree(pub PathBuf);

    impl Tree {
        pub fn new(tag: &str) -> Tree {
            let dir = std::env::temp_dir().join(format!(
                "prima-cgroup-{}-{tag}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Tree(dir)
        }

        /// Writes `content` to `rel` (a path like `sys/fs/cgroup/memory/x/memory.stat`).
        pub fn file(&self, rel: &str, content: &str) -> &Tree {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
            self
        }

        pub fn root(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// mountinfo of a hybrid host like the one these tests were recorded on: v1
    /// controllers under /sys/fs/cgroup/<name>, the unified hierarchy at …/unified.
    pub const HYBRID_MOUNTINFO: &str = "\
25 1 0:23 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// mountinfo of a pure v2 host (systemd's default today).
    pub const V2_MOUNTINFO: &str = "\
25 1 0:23 / / rw,relatime - ext4 /dev/sda1 rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";
}

#[cfg(test)]
mod tests {
    use super::testtree::*;
    use super::*;

    #[test]
    fn v2_chain_runs_from_own_cgroup_to_the_root() {
        let s = CgroupSources {
            proc_cgroup: "0::/system.slice/prima.service\n".into(),
            mountinfo: V2_MOUNTINFO.into(),
            root: "/r".into(),
        };
        let chain = s.chain("memory");
        let paths: Vec<_> = chain.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["/system.slice/prima.service", "/system.slice", "/"]);
        assert_eq!(
            chain[0].dir,
            Path::new("/r/sys/fs/cgroup/system.slice/prima.service")
        );
        assert_eq!(chain[2].dir, Path::new("/r/sys/fs/cgroup"));
        assert!(chain.iter().all(|d| d.version == CgroupVersion::V2));
    }

    #[test]
    fn v1_chain_follows_the_controller_mount() {
        let s = CgroupSources {
            proc_cgroup: "4:memory:/prima-dev1\n1:cpu:/\n0::/\n".into(),
            mountinfo: HYBRID_MOUNTINFO.into(),
            root: "/r".into(),
        };
        let chain = s.chain("memory");
        // v2 (unified, at the root) first, then the v1 memory chain.
        assert_eq!(chain[0].version, CgroupVersion::V2);
        let v1: Vec<_> = chain
            .iter()
            .filter(|d| d.version == CgroupVersion::V1)
            .map(|d| (d.path.as_str(), d.dir.clone()))
            .collect();
        assert_eq!(
            v1,
            [
                (
                    "/prima-dev1",
                    PathBuf::from("/r/sys/fs/cgroup/memory/prima-dev1")
                ),
                ("/", PathBuf::from("/r/sys/fs/cgroup/memory")),
            ]
        );
    }

    #[test]
    fn a_bind_mounted_subtree_is_entered_below_its_root() {
        // Docker without a cgroup namespace: the container sees its own cgroup mounted.
        let s = CgroupSources {
            proc_cgroup: "5:cpu,cpuacct:/docker/abc\n".into(),
            mountinfo: "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n".into(),
            root: "/".into(),
        };
        let chain = s.chain("cpu");
        assert_eq!(chain.len(), 1);
        assert_eq!(chain[0].path, "/docker/abc");
        assert_eq!(chain[0].dir, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn garbled_texts_give_no_cgroups() {
        let s = CgroupSources {
            proc_cgroup: "garbage\n::\n7\n".into(),
            mountinfo: "nonsense - \n- cgroup2\n".into(),
            root: "/".into(),
        };
        assert!(s.chain("memory").is_empty());
    }
}
