//! The memory controller: how much this process's cgroups may hold, and how much of that
//! is still free for it once reclaimable page cache is counted as free.

use serde::Serialize;

use super::{read_control, stat_value, CgroupDir, CgroupSources, CgroupVersion};

/// v1 writes "no limit" as the largest page-aligned i64 (9223372036854771712); anything
/// this large is no limit on any real device.
const UNLIMITED_FROM: u64 = 1 << 62;

/// The tightest memory limit among this process's cgroups.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryLimit {
    pub version: CgroupVersion,
    /// The cgroup whose limit is the tightest.
    pub path: String,
    pub limit_bytes: u64,
    /// What is left under the limits: for each cgroup, its limit less the usage that
    /// cannot be reclaimed (usage less file cache); the smallest of these.
    pub available_bytes: u64,
}

/// The limit and the room left under it, for one cgroup; `None` where it has no limit or
/// its limit cannot be read.
fn level(dir: &CgroupDir) -> Option<(u64, u64)> {
    let (limit, usage, reclaimable) = match dir.version {
        CgroupVersion::V2 => {
            let max = read_control(&dir.dir, "memory.max")?;
            let limit: u64 = if max == "max" {
                return None;
            } else {
                max.parse().ok()?
            };
            let usage = read_control(&dir.dir, "memory.current").and_then(|u| u.parse().ok());
            let stat = read_control(&dir.dir, "memory.stat").unwrap_or_default();
            let file = match (
                stat_value(&stat, "inactive_file"),
                stat_value(&stat, "active_file"),
            ) {
                (Some(i), Some(a)) => Some(i + a),
                _ => stat_value(&stat, "file"),
            };
            (limit, usage, file)
        }
        CgroupVersion::V1 => {
            let stat = read_control(&dir.dir, "memory.stat").unwrap_or_default();
            // A v1 child does not show its ancestors' limits in limit_in_bytes, but the
            // kernel sums them up in memory.stat (useful where the ancestors are not
            // mounted, as inside a container).
            let own: Option<u64> =
                read_control(&dir.dir, "memory.limit_in_bytes").and_then(|l| l.parse().ok());
            let hierarchical = stat_value(&stat, "hierarchical_memory_limit");
            let limit = match (own, hierarchical) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b)?,
            };
            let usage =
                read_control(&dir.dir, "memory.usage_in_bytes").and_then(|u| u.parse().ok());
            let pair =
                |inactive, active| Some(stat_value(&stat, inactive)? + stat_value(&stat, active)?);
            let file = pair("total_inactive_file", "total_active_file")
                .or_else(|| pair("inactive_file", "active_file"));
            (limit, usage, file)
        }
    };
    if limit >= UNLIMITED_FROM {
        return None;
    }
    // An unreadable usage leaves the limit alone as the bound: the host's MemAvailable
    // still caps what the device reports.
    let unreclaimable = usage
        .unwrap_or(0u64)
        .saturating_sub(reclaimable.unwrap_or(0));
    Some((limit, limit.saturating_sub(unreclaimable)))
}

/// The tightest memory limit over this process's cgroups and their ancestors, v1 and v2;
/// `None` when none of them limits memory.
pub fn memory_limit(sources: &CgroupSources) -> Option<MemoryLimit> {
    memory_limit_over(&sources.chain("memory"))
}

/// [`memory_limit`] over cgroups already located (the ring samples memory every pass and
/// locates its cgroups once).
pub fn memory_limit_over(chain: &[CgroupDir]) -> Option<MemoryLimit> {
    let mut best: Option<MemoryLimit> = None;
    for dir in chain {
        let Some((limit, available)) = level(dir) else {
            continue;
        };
        best = Some(match best {
            None => MemoryLimit {
                version: dir.version,
                path: dir.path.clone(),
                limit_bytes: limit,
                available_bytes: available,
            },
            Some(mut b) => {
                if limit < b.limit_bytes {
                    b.version = dir.version;
                    b.path = dir.path.clone();
                    b.limit_bytes = limit;
                }
                b.available_bytes = b.available_bytes.min(available);
                b
            }
        });
    }
    best.map(|mut b| {
        b.available_bytes = b.available_bytes.min(b.limit_bytes);
        b
    })
}

#[cfg(test)]
mod tests {
    use super::super::testtree::*;
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sources(tree: &Tree, proc_cgroup: &str, mountinfo: &str) -> CgroupSources {
        CgroupSources {
            proc_cgroup: proc_cgroup.into(),
            mountinfo: mountinfo.into(),
            root: tree.root().to_path_buf(),
        }
    }

    #[test]
    fn v2_limit_less_unreclaimable_usage() {
        let t = Tree::new("mem-v2");
        let d = "sys/fs/cgroup/prima";
        t.file(&format!("{d}/memory.max"), &format!("{}\n", 512 * MIB))
            .file(&format!("{d}/memory.current"), &format!("{}\n", 300 * MIB))
            .file(
                &format!("{d}/memory.stat"),
                &format!(
                    "anon {}\nfile {}\ninactive_file {}\nactive_file {}\n",
                    200 * MIB,
                    100 * MIB,
                    60 * MIB,
                    40 * MIB
                ),
            );
        let m = memory_limit(&sources(&t, "0::/prima\n", V2_MOUNTINFO)).unwrap();
        assert_eq!(m.version, CgroupVersion::V2);
        assert_eq!(m.path, "/prima");
        assert_eq!(m.limit_bytes, 512 * MIB);
        // 300 MiB used, 100 MiB of it page cache: 512 − 200 left.
        assert_eq!(m.available_bytes, 312 * MIB);
    }

    #[test]
    fn v2_max_is_no_limit() {
        let t = Tree::new("mem-v2-max");
        t.file("sys/fs/cgroup/prima/memory.max", "max\n")
            .file("sys/fs/cgroup/prima/memory.current", "1000\n");
        assert_eq!(
            memory_limit(&sources(&t, "0::/prima\n", V2_MOUNTINFO)),
            None
        );
    }

    #[test]
    fn v2_nested_parent_tighter_wins() {
        let t = Tree::new("mem-v2-nested");
        t.file("sys/fs/cgroup/lab/memory.max", &format!("{}", 256 * MIB))
            .file(
                "sys/fs/cgroup/lab/memory.current",
                &format!("{}", 200 * MIB),
            )
            .file("sys/fs/cgroup/lab/memory.stat", "file 0\n")
            .file(
                "sys/fs/cgroup/lab/dev1/memory.max",
                &format!("{}", 1024 * MIB),
            )
            .file(
                "sys/fs/cgroup/lab/dev1/memory.current",
                &format!("{}", 50 * MIB),
            )
            .file("sys/fs/cgroup/lab/dev1/memory.stat", "file 0\n");
        let m = memory_limit(&sources(&t, "0::/lab/dev1\n", V2_MOUNTINFO)).unwrap();
        assert_eq!(m.path, "/lab");
        assert_eq!(m.limit_bytes, 256 * MIB);
        // The parent's siblings use 150 MiB of its 256: only 56 MiB are left for dev1.
        assert_eq!(m.available_bytes, 56 * MIB);
    }

    #[test]
    fn v1_limit_with_total_file_cache() {
        let t = Tree::new("mem-v1");
        let d = "sys/fs/cgroup/memory/prima-dev1";
        t.file(&format!("{d}/memory.limit_in_bytes"), &format!("{}\n", 500 * MIB))
            .file(&format!("{d}/memory.usage_in_bytes"), &format!("{}\n", 120 * MIB))
            .file(
                &format!("{d}/memory.stat"),
                &format!(
                    "cache 1\ninactive_file 5\nactive_file 5\nhierarchical_memory_limit {}\ntotal_inactive_file {}\ntotal_active_file {}\n",
                    500 * MIB,
                    15 * MIB,
                    5 * MIB
                ),
            )
            .file(
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            );
        let m = memory_limit(&sources(
            &t,
            "4:memory:/prima-dev1\n0::/\n",
            HYBRID_MOUNTINFO,
        ))
        .unwrap();
        assert_eq!(m.version, CgroupVersion::V1);
        assert_eq!(m.path, "/prima-dev1");
        assert_eq!(m.limit_bytes, 500 * MIB);
        assert_eq!(m.available_bytes, 400 * MIB);
    }

    #[test]
    fn v1_hierarchical_limit_counts_unseen_ancestors() {
        let t = Tree::new("mem-v1-hier");
        let d = "sys/fs/cgroup/memory/dev";
        t.file(
            &format!("{d}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .file(
            &format!("{d}/memory.usage_in_bytes"),
            &format!("{}", 10 * MIB),
        )
        .file(
            &format!("{d}/memory.stat"),
            &format!("hierarchical_memory_limit {}\n", 64 * MIB),
        );
        let m = memory_limit(&sources(&t, "4:memory:/dev\n", HYBRID_MOUNTINFO)).unwrap();
        assert_eq!((m.limit_bytes, m.available_bytes), (64 * MIB, 54 * MIB));
    }

    #[test]
    fn v1_unlimited_is_no_limit() {
        let t = Tree::new("mem-v1-unlimited");
        t.file(
            "sys/fs/cgroup/memory/dev/memory.limit_in_bytes",
            "9223372036854771712\n",
        )
        .file("sys/fs/cgroup/memory/dev/memory.usage_in_bytes", "4096\n")
        .file(
            "sys/fs/cgroup/memory/dev/memory.stat",
            "hierarchical_memory_limit 9223372036854771712\n",
        );
        assert_eq!(
            memory_limit(&sources(&t, "4:memory:/dev\n", HYBRID_MOUNTINFO)),
            None
        );
    }

    #[test]
    fn missing_and_garbled_files_are_no_limit() {
        let t = Tree::new("mem-garbled");
        t.file("sys/fs/cgroup/a/memory.max", "lots\n")
            .file(
                "sys/fs/cgroup/memory/b/memory.limit_in_bytes",
                "\u{0}\u{1}xx",
            )
            .file(
                "sys/fs/cgroup/memory/b/memory.stat",
                "hierarchical_memory_limit\n",
            );
        for (cg, mi) in [
            ("0::/a\n", V2_MOUNTINFO),
            ("4:memory:/b\n", HYBRID_MOUNTINFO),
            ("4:memory:/not-there\n0::/nor-here\n", HYBRID_MOUNTINFO),
            ("", ""),
        ] {
            assert_eq!(memory_limit(&sources(&t, cg, mi)), None, "{cg:?}");
        }
    }

    #[test]
    fn usage_above_the_limit_leaves_nothing_never_wraps() {
        let t = Tree::new("mem-over");
        t.file("sys/fs/cgroup/x/memory.max", "1000\n")
            .file("sys/fs/cgroup/x/memory.current", "5000\n");
        let m = memory_limit(&sources(&t, "0::/x\n", V2_MOUNTINFO)).unwrap();
        assert_eq!((m.limit_bytes, m.available_bytes), (1000, 0));
    }
}
