//! The cgroup-v1 groups that give each emulated device its memory, CPU and disk: one
//! `prima-hl/<device>` directory per controller (memory, cpu, cpuset, blkio).
//!
//! Everything the home lab starts lives in a `prima-hl/…` memory cgroup, so `down` finds
//! every process by this naming convention alone, even after a crash.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::testbed::Device;

/// The parent group of every home-lab group, in every controller.
pub const PARENT: &str = "prima-hl";
/// The group of the link router (no limits; only so that `down` finds it).
pub const ROUTER_GROUP: &str = "link-router";
/// CFS period: 100 ms, the kernel's default.
const CFS_PERIOD_US: u64 = 100_000;

/// The controllers the home lab uses, in the order a process joins them.
pub const CONTROLLERS: [&str; 4] = ["memory", "cpu", "cpuset", "blkio"];

/// Where each cgroup-v1 controller is mounted, read from /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct Hierarchies {
    roots: Vec<(&'static str, PathBuf)>,
}

impl Hierarchies {
    /// Finds the v1 mounts of every controller the home lab needs.
    pub fn discover() -> Result<Hierarchies> {
        let text = fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
        let mut roots = Vec::new();
        for controller in CONTROLLERS {
            let found = text.lines().find_map(|line| {
                // "… mountpoint options - fstype source superoptions"
                let (left, right) = line.split_once(" - ")?;
                let mut right = right.split_whitespace();
                if right.next()? != "cgroup" {
                    return None;
                }
                let options = right.nth(1)?;
                options
                    .split(',')
                    .any(|o| o == controller)
                    .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap_or("")))
            });
            match found {
                Some(root) => roots.push((controller, root)),
                None => bail!(
                    "no cgroup-v1 '{controller}' hierarchy is mounted (the home lab needs \
                     cgroup v1: memory, cpu, cpuset and blkio)"
                ),
            }
        }
        Ok(Hierarchies { roots })
    }

    fn root(&self, controller: &str) -> &Path {
        &self
            .roots
            .iter()
            .find(|(c, _)| *c == controller)
            .expect("every controller was found")
            .1
    }

    /// `<controller root>/prima-hl/<group>`.
    pub fn group(&self, controller: &str, group: &str) -> PathBuf {
        self.root(controller).join(PARENT).join(group)
    }

    /// The `cgroup.procs` files a process writes its pid to, to join `group` everywhere.
    pub fn procs_files(&self, group: &str) -> Vec<PathBuf> {
        CONTROLLERS
            .iter()
            .map(|c| self.group(c, group).join("cgroup.procs"))
            .collect()
    }

    /// Creates the groups of one device and sets its limits.
    pub fn create_device(&self, device: &Device, disk: Option<&str>) -> Result<()> {
        self.create_parents()?;
        let name = &device.name;
        for c in CONTROLLERS {
            mkdir(&self.group(c, name))?;
        }
        let memory = self.group("memory", name);
        write(
            &memory.join("memory.limit_in_bytes"),
            &device.memory.to_string(),
        )?;
        // No swap here; keep the kernel from preferring anonymous memory over the cache.
        let _ = write(&memory.join("memory.swappiness"), "0");

        let cpu = self.group("cpu", name);
        write(&cpu.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
        let quota = (device.cpu * CFS_PERIOD_US as f64).round().max(1000.0) as u64;
        write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;

        let cpuset = self.group("cpuset", name);
        let parent = self.root("cpuset").join(PARENT);
        let cpus = match &device.cpuset {
            Some(set) => set.clone(),
            None => read(&parent.join("cpuset.cpus"))?,
        };
        write(&cpuset.join("cpuset.cpus"), &cpus)
            .with_context(|| format!("device '{name}': cpuset = \"{cpus}\""))?;
        write(
            &cpuset.join("cpuset.mems"),
            &read(&parent.join("cpuset.mems"))?,
        )?;

        if let (Some(rate), Some(disk)) = (device.disk_read, disk) {
            let blkio = self.group("blkio", name);
            write(
                &blkio.join("blkio.throttle.read_bps_device"),
                &format!("{disk} {rate}"),
            )?;
        }
        Ok(())
    }

    /// The router's group: memory only (for finding it), no limits.
    pub fn create_router_group(&self) -> Result<()> {
        self.create_parents()?;
        mkdir(&self.group("memory", ROUTER_GROUP))
    }

    /// `prima-hl` in every controller; a new cpuset group starts with no CPUs and no
    /// memory nodes, so it gets its parent's.
    fn create_parents(&self) -> Result<()> {
        for c in CONTROLLERS {
            mkdir(&self.root(c).join(PARENT))?;
        }
        let root = self.root("cpuset");
        let parent = root.join(PARENT);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if read(&parent.join(file))?.is_empty() {
                write(&parent.join(file), &read(&root.join(file))?)?;
            }
        }
        Ok(())
    }

    /// Every home-lab group that exists, per controller: (controller, group name, path).
    pub fn existing(&self) -> Vec<(&'static str, String, PathBuf)> {
        let mut found = Vec::new();
        for (c, root) in &self.roots {
            let Ok(entries) = fs::read_dir(root.join(PARENT)) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    found.push((*c, name, entry.path()));
                }
            }
        }
        found
    }

    /// Pids in any home-lab group of any controller.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .existing()
            .iter()
            .flat_map(|(_, _, path)| read_pids(path))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes every home-lab group (they must be empty of processes) and the parents.
    pub fn remove_all(&self) -> Result<()> {
        for (_, _, path) in self.existing() {
            rmdir(&path)?;
        }
        for (_, root) in &self.roots {
            let parent = root.join(PARENT);
            if parent.exists() {
                rmdir(&parent)?;
            }
        }
        Ok(())
    }

    /// Whether any home-lab group exists.
    pub fn any(&self) -> bool {
        self.roots.iter().any(|(_, r)| r.join(PARENT).exists())
    }
}

/// The pids in one group.
pub fn read_pids(group: &Path) -> Vec<i32> {
    fs::read_to_string(group.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// "major:minor" of the whole disk that holds `path`, for blkio (which refuses
/// partitions), or None when `path` is not on a block device (tmpfs, overlay, NFS).
pub fn disk_of(path: &Path) -> Result<Option<String>> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .dev();
    // glibc's major()/minor() encoding.
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x00ff);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        return Ok(None);
    }
    if sys.join("partition").exists() {
        // …/block/vda/vda1 → the parent directory is the disk.
        let disk = fs::canonicalize(&sys)
            .with_context(|| format!("resolving {}", sys.display()))?
            .parent()
            .map(|p| p.join("dev"))
            .context("a partition without a disk")?;
        return Ok(Some(read(&disk)?));
    }
    Ok(Some(format!("{major}:{minor}")))
}

fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating cgroup {}", path.display())),
    }
}

fn rmdir(path: &Path) -> Result<()> {
    // A cgroup directory is removed with rmdir alone: its files are not real files.
    fs::remove_dir(path).with_context(|| format!("removing cgroup {}", path.display()))
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).with_context(|| format!("writing '{value}' to {}", path.display()))
}

fn read(path: &Path) -> Result<String> {
    Ok(fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .to_string())
}
