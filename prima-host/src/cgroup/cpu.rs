//! The CPU controller's bandwidth limit: at most `quota` µs of CPU time every `period` µs,
//! i.e. quota ÷ period cores' worth of time, however many CPUs the process may run on.

use serde::Serialize;

use super::{read_control, CgroupDir, CgroupSources, CgroupVersion};

/// v2's period when cpu.max gives only a quota (the kernel's default).
const DEFAULT_PERIOD_US: u64 = 100_000;

/// The tightest CPU quota among this process's cgroups.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuQuota {
    pub version: CgroupVersion,
    /// The cgroup whose quota is the tightest.
    pub path: String,
    pub quota_us: u64,
    pub period_us: u64,
}

impl CpuQuota {
    /// Cores' worth of CPU time, e.g. 0.5 for 50000/100000.
    pub fn cores(&self) -> f64 {
        self.quota_us as f64 / self.period_us as f64
    }

    /// Threads that can be busy at once without waiting for the next period: quota ÷
    /// period rounded up (half a core still runs one thread), at least 1.
    pub fn whole_cores(&self) -> usize {
        self.quota_us.div_ceil(self.period_us).max(1) as usize
    }
}

/// v2's cpu.max, "quota period" or "max period": `Some((quota, period))` for a quota,
/// `None` for "max" or text that does not parse.
pub fn parse_cpu_max(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse().ok()?;
    let period = match fields.next() {
        Some(p) => p.parse().ok()?,
        None => DEFAULT_PERIOD_US,
    };
    (quota > 0 && period > 0).then_some((quota, period))
}

/// One cgroup's quota and period; `None` where it has none or it cannot be read.
fn level(dir: &CgroupDir) -> Option<(u64, u64)> {
    match dir.version {
        CgroupVersion::V2 => parse_cpu_max(&read_control(&dir.dir, "cpu.max")?),
        CgroupVersion::V1 => {
            // -1 is "no quota"; it fails the unsigned parse like any other non-quota.
            let quota: u64 = read_control(&dir.dir, "cpu.cfs_quota_us")?.parse().ok()?;
            let period: u64 = read_control(&dir.dir, "cpu.cfs_period_us")?.parse().ok()?;
            (quota > 0 && period > 0).then_some((quota, period))
        }
    }
}

/// The tightest CPU quota over this process's cgroups and their ancestors, v1 and v2;
/// `None` when none of them has one.
pub fn cpu_quota(sources: &CgroupSources) -> Option<CpuQuota> {
    sources
        .chain("cpu")
        .iter()
        .filter_map(|dir| {
            let (quota_us, period_us) = level(dir)?;
            Some(CpuQuota {
                version: dir.version,
                path: dir.path.clone(),
                quota_us,
                period_us,
            })
        })
        .min_by(|a, b| a.cores().total_cmp(&b.cores()))
}

#[cfg(test)]
mod tests {
    use super::super::testtree::*;
    use super::*;

    fn sources(tree: &Tree, proc_cgroup: &str, mountinfo: &str) -> CgroupSources {
        CgroupSources {
            proc_cgroup: proc_cgroup.into(),
            mountinfo: mountinfo.into(),
            root: tree.root().to_path_buf(),
        }
    }

    #[test]
    fn cpu_max_forms() {
        assert_eq!(parse_cpu_max("50000 100000\n"), Some((50000, 100000)));
        assert_eq!(parse_cpu_max("max 100000"), None);
        assert_eq!(parse_cpu_max("150000"), Some((150000, 100000)));
        assert_eq!(parse_cpu_max("0 100000"), None);
        assert_eq!(parse_cpu_max("fifty 100000"), None);
        assert_eq!(parse_cpu_max(""), None);
    }

    #[test]
    fn whole_cores_round_up() {
        let q = |quota_us, period_us| CpuQuota {
            version: CgroupVersion::V2,
            path: "/".into(),
            quota_us,
            period_us,
        };
        assert_eq!(q(50_000, 100_000).whole_cores(), 1);
        assert_eq!(q(100_000, 100_000).whole_cores(), 1);
        assert_eq!(q(150_000, 100_000).whole_cores(), 2);
        assert_eq!(q(1, 100_000).whole_cores(), 1);
        assert_eq!(q(150_000, 100_000).cores(), 1.5);
    }

    #[test]
    fn v2_nested_quota_tightest_wins() {
        let t = Tree::new("cpu-v2");
        t.file("sys/fs/cgroup/lab/cpu.max", "150000 100000\n")
            .file("sys/fs/cgroup/lab/dev1/cpu.max", "max 100000\n");
        let q = cpu_quota(&sources(&t, "0::/lab/dev1\n", V2_MOUNTINFO)).unwrap();
        assert_eq!(
            (q.path.as_str(), q.quota_us, q.period_us),
            ("/lab", 150000, 100000)
        );
        assert_eq!(q.whole_cores(), 2);
    }

    #[test]
    fn v1_quota_and_none() {
        let t = Tree::new("cpu-v1");
        t.file("sys/fs/cgroup/cpu/dev1/cpu.cfs_quota_us", "50000\n")
            .file("sys/fs/cgroup/cpu/dev1/cpu.cfs_period_us", "100000\n")
            .file("sys/fs/cgroup/cpu/dev2/cpu.cfs_quota_us", "-1\n")
            .file("sys/fs/cgroup/cpu/dev2/cpu.cfs_period_us", "100000\n")
            .file("sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n")
            .file("sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
        let q = cpu_quota(&sources(&t, "1:cpu:/dev1\n0::/\n", HYBRID_MOUNTINFO)).unwrap();
        assert_eq!(q.version, CgroupVersion::V1);
        assert_eq!((q.path.as_str(), q.cores()), ("/dev1", 0.5));
        assert_eq!(
            cpu_quota(&sources(&t, "1:cpu:/dev2\n0::/\n", HYBRID_MOUNTINFO)),
            None
        );
    }

    #[test]
    fn garbled_or_missing_quota_is_none() {
        let t = Tree::new("cpu-garbled");
        t.file("sys/fs/cgroup/cpu/dev/cpu.cfs_quota_us", "50000\n")
            .file("sys/fs/cgroup/cpu/dev/cpu.cfs_period_us", "zero\n")
            .file("sys/fs/cgroup/x/cpu.max", "\u{0}\n");
        assert_eq!(
            cpu_quota(&sources(&t, "1:cpu:/dev\n", HYBRID_MOUNTINFO)),
            None
        );
        assert_eq!(cpu_quota(&sources(&t, "0::/x\n", V2_MOUNTINFO)), None);
        assert_eq!(
            cpu_quota(&sources(&t, "1:cpu:/gone\n", HYBRID_MOUNTINFO)),
            None
        );
    }
}
