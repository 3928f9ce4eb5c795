//! Reading the figures the tools print: prima's summary line and plan header, llama.cpp's
//! `llama_perf_context_print` lines. Text in, numbers out; nothing here runs anything.

/// What one generation reported about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub generated: Option<usize>,
}

/// prima's summary line (`prima run` and `prima apply --prompt`, on stderr):
/// `prompt: 5 tokens, 12.3 tok/s | TTFT 406.1 ms | generated 8 tokens, TPOT 98.76 ms (10.1 tok/s) | …`.
pub fn prima_summary(stderr: &str) -> Option<Timing> {
    let line = stderr.lines().rev().find(|l| l.starts_with("prompt: "))?;
    Some(Timing {
        ttft_ms: number_after(line, "TTFT "),
        tpot_ms: number_after(line, "TPOT "),
        generated: number_after(line, "generated ").map(|n| n as usize),
    })
}

/// The plan `prima apply` printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub predicted_tpot_ms: Option<f64>,
    /// Rounds per token.
    pub k: Option<usize>,
    /// `(device, w, layers)` in the printed order.
    pub devices: Vec<(String, usize, usize)>,
}

/// The plan prima prints before launching the ring: `plan (halda scheduler, k = 2,
/// predicted TPOT 123.4 ms):`, then a header and one row per device
/// (`name address set w n layers share note`).
pub fn prima_plan(stderr: &str) -> Plan {
    let mut lines = stderr.lines().skip_while(|l| !l.starts_with("plan ("));
    let Some(header) = lines.next() else {
        return Plan::default();
    };
    let devices = lines
        .skip(1) // the column names
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(3)?.parse().ok()?,
                f.get(5)?.parse().ok()?,
            ))
        })
        .collect();
    Plan {
        predicted_tpot_ms: number_after(header, "predicted TPOT "),
        k: number_after(header, "k = ").map(|k| k as usize),
        devices,
    }
}

/// One device's line of the ring's per-device table (`prima apply -v`, `prima run --ring
/// -v`): means per generated token (decode passes only; the prompt's are left out).
#[derive(Debug, Clone, PartialEq)]
pub struct RingLine {
    /// `head`, or the node's `address:port`.
    pub addr: String,
    /// Generated tokens the means are over.
    pub tokens: usize,
    pub compute_ms: f64,
    pub send_ms: f64,
    pub wait_ms: f64,
    pub major_faults: f64,
    /// MB (10^6 bytes) read from storage (/proc/self/io read_bytes).
    pub disk_mb: f64,
    /// The device's own peak memory pressure over the run, percent.
    pub memory_pressure_pct: f64,
}

/// The per-device table prima prints after a ring generation with `-v`:
/// `device address tokens compute ms send ms wait ms major flt disk MB mem press [expert hit]`,
/// then one line per device (`d1 head 7 12.345 0.100 5.000 12.0 0.05 3.2% -`).
pub fn ring_table(stderr: &str) -> Vec<RingLine> {
    let lines: Vec<&str> = stderr.lines().collect();
    let Some(start) = lines
        .iter()
        .rposition(|l| l.starts_with("device ") && l.contains("disk MB"))
    else {
        return Vec::new();
    };
    lines[start + 1..]
        .iter()
        .map_while(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // The ninth column is the memory pressure; a tenth (the expert hit rate) may follow.
            if !(9..=10).contains(&f.len()) {
                return None;
            }
            let num = |i: usize| f[i].trim_end_matches('%').parse::<f64>().ok();
            Some(RingLine {
                addr: f[1].to_string(),
                tokens: f[2].parse().ok()?,
                compute_ms: num(3)?,
                send_ms: num(4)?,
                wait_ms: num(5)?,
                major_faults: num(6)?,
                disk_mb: num(7)?,
                memory_pressure_pct: num(8)?,
            })
        })
        .collect()
}

/// llama.cpp's timing lines (`llama-completion`, on stderr; `common_perf_print:` in newer
/// builds, after a log timestamp):
/// `llama_perf_context_print: prompt eval time =  120.50 ms /  5 tokens (…)` and
/// `llama_perf_context_print:        eval time =  700.00 ms /  7 runs   ( 100.00 ms per token, …)`.
/// TTFT is its prompt-eval time (the first token's sampling is not in it); TPOT its
/// eval time per run; generated = eval runs + 1 (the first token comes from the prompt).
pub fn llama_perf(stderr: &str) -> Option<Timing> {
    let mut t = Timing::default();
    for line in stderr.lines() {
        // Older builds prefix `llama_perf_context_print:`, newer ones (with a log
        // timestamp before it) `common_perf_print:`.
        let Some(rest) = ["llama_perf_context_print:", "common_perf_print:"]
            .iter()
            .find_map(|p| line.split_once(p).map(|x| x.1))
        else {
            continue;
        };
        let rest = rest.trim_start();
        if let Some(v) = rest.strip_prefix("prompt eval time =") {
            t.ttft_ms = leading_number(v);
        } else if let Some(v) = rest.strip_prefix("eval time =") {
            t.tpot_ms = number_after(v, "(");
            let runs = v.split_once('/').and_then(|(_, r)| leading_number(r));
            t.generated = runs.map(|r| r as usize + 1);
        }
    }
    (t.ttft_ms.is_some() || t.tpot_ms.is_some()).then_some(t)
}

/// The number right after the first `key` in `text`.
fn number_after(text: &str, key: &str) -> Option<f64> {
    leading_number(&text[text.find(key)? + key.len()..])
}

fn leading_number(text: &str) -> Option<f64> {
    let text = text.trim_start();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(text.len());
    text[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prima_summary() {
        let stderr =
            "loading …\nprompt: 5 tokens, 12.3 tok/s | TTFT 406.1 ms | generated 8 tokens, \
            TPOT 98.76 ms (10.1 tok/s) | seed 0 | cpu avx2 | ring of 4 devices, k = 1\nd1 …\n";
        let t = prima_summary(stderr).unwrap();
        assert_eq!(t.ttft_ms, Some(406.1));
        assert_eq!(t.tpot_ms, Some(98.76));
        assert_eq!(t.generated, Some(8));
        assert_eq!(prima_summary("error: connection refused\n"), None);
    }

    #[test]
    fn reads_prima_plan() {
        let stderr = "profiling d2 …\n\
plan (halda scheduler, k = 2, predicted TPOT 123.4 ms):\n  \
device       address                 set    w    n  layers   share  note\n  \
d1           local                     M    3    0       6     38%  \n  \
d3           10.87.0.3:9000            M    5    0      10     62%  \n\
launching the ring\n";
        let plan = prima_plan(stderr);
        assert_eq!(plan.predicted_tpot_ms, Some(123.4));
        assert_eq!(plan.k, Some(2));
        assert_eq!(
            plan.devices,
            vec![("d1".into(), 3, 6), ("d3".into(), 5, 10)]
        );
        let plan = prima_plan("plan (mem scheduler, k = 1):\n  device …\n");
        assert_eq!((plan.predicted_tpot_ms, plan.k), (None, Some(1)));
        assert!(plan.devices.is_empty());
    }

    #[test]
    fn reads_the_ring_table() {
        // As `prima apply … -v` prints it after the summary line.
        let stderr = "\
prompt: 5 tokens, 40.1 tok/s | TTFT 125.0 ms | generated 4 tokens, TPOT 61.20 ms (16.3 tok/s) | seed 0 | cpu avx2 | ring of 4 devices, k = 2
device   address                  tokens  compute ms   send ms   wait ms    major flt      disk MB  mem press  expert hit
0        head                          3      12.345     0.100    45.000         12.0         0.05       3.2%           -
d2       10.87.0.2:9000                3      10.000     0.080    50.120        301.3        14.57      12.0%       81.5%
2        10.87.0.3:9000                3       9.500     0.090    51.000          0.0         0.00       0.0%
prompt passes: 0 compute 1.0 ms, wait 400.0 ms, send 0.1 ms
node: bye
";
        let t = ring_table(stderr);
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].addr, "head");
        assert_eq!(t[0].tokens, 3);
        assert_eq!(t[1].addr, "10.87.0.2:9000");
        assert_eq!((t[1].major_faults, t[1].disk_mb), (301.3, 14.57));
        assert_eq!(
            (t[1].compute_ms, t[1].send_ms, t[1].wait_ms),
            (10.0, 0.08, 50.12)
        );
        assert_eq!(t[1].memory_pressure_pct, 12.0);
        assert_eq!(t[2].disk_mb, 0.0);
        assert!(ring_table("prompt: 5 tokens\n").is_empty());
    }

    #[test]
    fn reads_llama_perf() {
        let stderr = "\
llama_perf_sampler_print:    sampling time =       0.52 ms /    13 runs   (    0.04 ms per token, 25000.00 tokens per second)\n\
llama_perf_context_print:        load time =     310.22 ms\n\
llama_perf_context_print: prompt eval time =     120.50 ms /     5 tokens (   24.10 ms per token,    41.49 tokens per second)\n\
llama_perf_context_print:        eval time =     700.00 ms /     7 runs   (  100.00 ms per token,    10.00 tokens per second)\n\
llama_perf_context_print:       total time =     830.10 ms /    12 tokens\n";
        let t = llama_perf(stderr).unwrap();
        assert_eq!(t.ttft_ms, Some(120.5));
        assert_eq!(t.tpot_ms, Some(100.0));
        assert_eq!(t.generated, Some(8));
        assert_eq!(llama_perf("main: error\n"), None);
        let newer = "\
0.00.979.146 I common_perf_print: prompt eval time =     333.03 ms /    15 tokens (   22.20 ms per token,    45.04 tokens per second)\n\
0.00.979.147 I common_perf_print:        eval time =     224.11 ms /     3 runs   (   74.70 ms per token,    13.39 tokens per second)\n";
        let t = llama_perf(newer).unwrap();
        assert_eq!(
            (t.ttft_ms, t.tpot_ms, t.generated),
            (Some(333.03), Some(74.7), Some(4))
        );
    }
}
