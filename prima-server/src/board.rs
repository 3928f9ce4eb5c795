//! The cluster board: what the web page's cluster panel shows — each device with its
//! role, backend, windows, memory and share of the token's time, the plan's k and
//! predicted TPOT beside the measured one, live tokens/s — and the ring's failover and
//! re-admission events, sent to every open page as they are recorded
//! (`GET /v1/cluster/events`, `web.rs`).
//!
//! One board per process, like the metrics recorder: the front end tells it the plan
//! once ([`show_plan`], [`show_alone`]); the worker updates it from what it already
//! records (a generation's TPOT, each token, a ring's statistics between requests) and
//! the ring tells it each failover event as it happens. It never reads `/metrics` and
//! never touches the model.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use prima_cluster::controller::Plan;
use prima_cluster::prp::counters::mem_available_total;
use prima_cluster::prp::failover::FailoverEvent;
use prima_cluster::prp::head::NodeInfo;
use prima_cluster::prp::DeviceStats;

/// Failover events kept for a page that opens later.
const EVENTS_KEPT: usize = 50;
/// Messages a slow page may fall behind before it misses some (it then gets a snapshot).
const CHANNEL: usize = 256;

/// One device as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DeviceView {
    pub name: String,
    /// "head" or "node".
    pub role: &'static str,
    /// Where the head reaches it ("head" for the head itself).
    pub addr: String,
    pub backend: String,
    /// Window size w_m (layers per round) and GPU layers n_m of each window.
    pub window: usize,
    pub gpu_layers: usize,
    /// Layers it runs per token (w_m × k).
    pub layers: usize,
    /// Bytes of memory in use on the device (MemTotal − MemAvailable, within its cgroup
    /// where it has one) after the last pass, and its limit (the plan's budget, else
    /// MemTotal).
    pub memory_used: Option<u64>,
    pub memory_limit: Option<u64>,
    /// Its share of the compute time of the last request's tokens (0 to 1).
    pub share: Option<f64>,
    /// "up", "lost", "pruned" (the plan left it out) or "relay".
    pub link: &'static str,
    /// The planned hop to the next device, ms (the head's timed link; Halda's t^{comm}).
    pub hop_ms: Option<f64>,
}

#[derive(Debug, Default)]
struct State {
    model: String,
    scheduler: String,
    k: usize,
    predicted_tpot_ms: Option<f64>,
    measured_tpot_ms: Option<f64>,
    devices: Vec<DeviceView>,
    events: VecDeque<Value>,
    /// One device, no ring: its memory is read here after each generation.
    alone: bool,
}

/// The process's board.
pub struct Board {
    state: Mutex<State>,
    changes: broadcast::Sender<Value>,
    tokens: AtomicU64,
}

/// The process-wide board.
pub fn board() -> &'static Board {
    static BOARD: OnceLock<Board> = OnceLock::new();
    BOARD.get_or_init(|| Board {
        state: Mutex::new(State {
            k: 1,
            ..State::default()
        }),
        changes: broadcast::channel(CHANNEL).0,
        tokens: AtomicU64::new(0),
    })
}

impl Board {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything the page shows, as one message of type "snapshot".
    pub fn snapshot(&self) -> Value {
        snapshot_of(&self.state())
    }

    /// A receiver of every later change (snapshots, events, generations).
    pub fn subscribe(&self) -> broadcast::Receiver<Value> {
        self.changes.subscribe()
    }

    /// Tokens generated since the process started (for tokens/s).
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Ends every open page's stream (the server is stopping).
    pub fn close_streams(&self) {
        let _ = self.changes.send(json!({"type": "bye"}));
    }

    fn publish(&self, state: &State) {
        // No page open: nothing to send, and that is fine.
        let _ = self.changes.send(snapshot_of(state));
    }

    fn event(&self, state: &mut State, kind: &str, device: Option<&str>, message: String) {
        let e = json!({
            "type": "event",
            "kind": kind,
            "device": device,
            "message": message,
            "at": unix_ms(),
        });
        if state.events.len() == EVENTS_KEPT {
            state.events.pop_front();
        }
        state.events.push_back(e.clone());
        let _ = self.changes.send(e);
    }
}

fn snapshot_of(s: &State) -> Value {
    json!({
        "type": "snapshot",
        "model": s.model,
        "scheduler": s.scheduler,
        "k": s.k,
        "predicted_tpot_ms": s.predicted_tpot_ms,
        "measured_tpot_ms": s.measured_tpot_ms,
        "devices": s.devices,
        "events": s.events,
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A server on this device alone (`prima serve -m`): one device, the head, running all
/// `layers` in one window.
pub fn show_alone(
    model: &str,
    host: &str,
    backend: &str,
    layers: usize,
    memory_limit: Option<u64>,
) {
    let b = board();
    let mut s = b.state();
    s.model = model.to_string();
    s.scheduler = "one device".into();
    s.k = 1;
    s.alone = true;
    s.devices = vec![DeviceView {
        name: host.to_string(),
        role: "head",
        addr: "head".into(),
        backend: backend.to_string(),
        window: layers,
        layers,
        memory_limit,
        link: "up",
        share: Some(1.0),
        ..DeviceView::default()
    }];
    read_own_memory(&mut s.devices[0]);
    b.publish(&s);
}

/// A manifest's plan (`prima apply`, `prima serve --manifest`), the head's backend
/// described by `head_backend`. Nodes' backends are filled in once they join.
pub fn show_plan(model: &str, plan: &Plan, head_backend: &str) {
    let b = board();
    let mut s = b.state();
    s.model = model.to_string();
    s.alone = false;
    s.scheduler = plan.scheduler.to_string();
    s.k = plan.k;
    s.predicted_tpot_ms = plan.predicted_tpot_ms;
    let mut first = true;
    s.devices = plan
        .devices
        .iter()
        .map(|d| {
            let in_ring = d.pruned.is_none() && d.forwards.is_none();
            let head = in_ring && std::mem::take(&mut first);
            DeviceView {
                name: d.name.clone(),
                role: if head { "head" } else { "node" },
                addr: d.addr.clone(),
                backend: if head {
                    head_backend.to_string()
                } else {
                    String::new()
                },
                window: d.w,
                gpu_layers: d.n,
                layers: d.layers,
                memory_limit: d.mem_budget,
                link: match (&d.pruned, &d.forwards) {
                    // Off when the ring was planned: lost until it answers.
                    (Some(_), _) if d.absent => "lost",
                    (Some(_), _) => "pruned",
                    (None, Some(_)) => "relay",
                    (None, None) => "up",
                },
                hop_ms: d.hop_ms,
                ..DeviceView::default()
            }
        })
        .collect();
    b.publish(&s);
}

/// The ring was planned again (a device lost or back): the new plan's k and predicted
/// TPOT. The devices follow at the next [`ring_now`].
pub fn replanned(plan: &Plan) {
    let b = board();
    let mut s = b.state();
    s.k = plan.k;
    s.predicted_tpot_ms = plan.predicted_tpot_ms;
    b.publish(&s);
}

/// A failover event as the ring records it (mid-request for a loss): sent to every open
/// page at once, and a lost device marked so.
pub fn failover_event(e: &FailoverEvent) {
    let b = board();
    let mut s = b.state();
    let (kind, device, message) = match e {
        FailoverEvent::Lost { device, reason } => {
            if let Some(view) = s.devices.iter_mut().find(|d| d.name == *device) {
                view.link = "lost";
                view.window = 0;
                view.layers = 0;
                view.share = None;
            }
            let message = format!("{device} lost ({reason}): planning the ring without it");
            ("lost", Some(device.as_str()), message)
        }
        FailoverEvent::Back { device } => (
            "back",
            Some(device.as_str()),
            format!("{device} answers again: planning it back into the ring"),
        ),
        FailoverEvent::Replanned { cause, devices } => (
            "replanned",
            None,
            format!("ring planned again ({}): {devices} devices", cause.as_str()),
        ),
        FailoverEvent::NoPlan => (
            "no_plan",
            None,
            "no ring could be planned over the devices left".to_string(),
        ),
        FailoverEvent::Recovered { after } => (
            "recovered",
            None,
            format!(
                "first logits {:.0} ms after the loss",
                after.as_secs_f64() * 1e3
            ),
        ),
    };
    let device = device.map(str::to_string);
    b.event(&mut s, kind, device.as_deref(), message);
    b.publish(&s);
}

/// One token generated (any slot).
pub(crate) fn count_token() {
    board().tokens.fetch_add(1, Ordering::Relaxed);
}

/// A finished generation: its TPOT becomes the measured one.
pub(crate) fn generation(tpot_ms: f64, completion_tokens: usize) {
    if completion_tokens < 2 {
        return;
    }
    let b = board();
    let mut s = b.state();
    s.measured_tpot_ms = Some(tpot_ms);
    let _ = b.changes.send(json!({
        "type": "generation",
        "tpot_ms": tpot_ms,
        "tokens": completion_tokens,
    }));
    if s.alone {
        if let Some(d) = s.devices.first_mut() {
            read_own_memory(d);
        }
        b.publish(&s);
    }
}

/// This device's memory in use now, and its total where no budget limits it.
fn read_own_memory(d: &mut DeviceView) {
    if let Some((available, total)) = mem_available_total() {
        d.memory_used = Some(total.saturating_sub(available));
        d.memory_limit = d.memory_limit.or(Some(total));
    }
}

/// What a resilient ring is now, between requests: the devices in it (names, windows,
/// the nodes' reports), those lost, k, and the statistics of the last request.
pub struct RingNow<'a> {
    pub devices: &'a [String],
    pub windows: &'a [usize],
    pub nodes: &'a [NodeInfo],
    pub lost: &'a [String],
    pub k: usize,
    pub stats: &'a [DeviceStats],
}

/// Updates the board from `now`: membership and link states, windows, memory, shares.
/// (Failover events come as they happen, through [`failover_event`].)
pub fn ring_now(now: &RingNow<'_>) {
    let b = board();
    let mut s = b.state();
    s.k = now.k;
    let total_compute: f64 = now
        .stats
        .iter()
        .flat_map(|d| d.passes.iter())
        .map(|p| p.compute_ms)
        .sum();
    for view in s.devices.iter_mut() {
        if matches!(view.link, "pruned" | "relay") && !now.devices.contains(&view.name) {
            continue;
        }
        let position = now.devices.iter().position(|n| *n == view.name);
        let link = match position {
            Some(_) => "up",
            None if now.lost.contains(&view.name) => "lost",
            None => view.link,
        };
        view.link = link;
        let Some(i) = position else {
            view.window = 0;
            view.layers = 0;
            view.share = None;
            continue;
        };
        if let Some(&w) = now.windows.get(i) {
            view.window = w;
            view.layers = w * now.k;
        }
        if let Some(node) = now.nodes.iter().find(|n| n.device == i) {
            view.backend = node.ready.backend.clone();
            view.layers = node.ready.layers;
            if view.memory_limit.is_none() {
                view.memory_limit = node.ready.mem_budget;
            }
        }
        if let Some(d) = now.stats.iter().find(|d| d.device == i) {
            let compute: f64 = d.passes.iter().map(|p| p.compute_ms).sum();
            if total_compute > 0.0 {
                view.share = Some(compute / total_compute);
            }
            let total = d.memory.mem_total;
            if let Some(last) = d.passes.iter().rev().find(|p| p.mem_available > 0) {
                view.memory_used = Some(total.saturating_sub(last.mem_available));
            }
            if view.memory_limit.is_none() && total > 0 {
                view.memory_limit = Some(total);
            }
        }
    }
    b.publish(&s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prima_cluster::controller::DevicePlan;
    use prima_cluster::prp::failover::ReplanCause;
    use prima_cluster::prp::NextRoute;

    fn device(name: &str, w: usize) -> DevicePlan {
        DevicePlan {
            name: name.into(),
            addr: if name == "desktop" {
                "head".into()
            } else {
                format!("{name}:1")
            },
            w,
            n: 0,
            layers: 2 * w,
            relay: false,
            pruned: None,
            absent: false,
            mem_budget: None,
            set: None,
            forwards: None,
            next_route: NextRoute::AsHead,
            hop_ms: None,
            predicted: None,
        }
    }

    fn now<'a>(devices: &'a [String], windows: &'a [usize], lost: &'a [String]) -> RingNow<'a> {
        RingNow {
            devices,
            windows,
            nodes: &[],
            lost,
            k: 2,
            stats: &[],
        }
    }

    fn links(snapshot: &Value) -> Vec<(String, String)> {
        snapshot["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap().into(),
                    d["link"].as_str().unwrap().into(),
                )
            })
            .collect()
    }

    /// The board is one per process: this one test drives it through a loss and a return.
    #[test]
    fn a_lost_device_is_marked_and_announced_and_so_is_its_return() {
        let mut phone = device("phone", 0);
        phone.pruned = Some("too slow".into());
        let plan = Plan {
            scheduler: "halda",
            k: 2,
            predicted_tpot_ms: Some(21.0),
            solve_ms: 1.0,
            devices: vec![
                device("desktop", 2),
                device("laptop", 5),
                device("tablet", 8),
                phone,
            ],
            output_on_last: false,
            alternatives: Vec::new(),
            profiles: Vec::new(),
        };
        show_plan("model", &plan, "cpu");
        let mut changes = board().subscribe();
        let s = board().snapshot();
        assert_eq!(s["k"], 2);
        assert_eq!(s["predicted_tpot_ms"], 21.0);
        assert_eq!(s["devices"][0]["role"], "head");
        assert_eq!(s["devices"][1]["role"], "node");
        let all = ["desktop", "laptop", "tablet"].map(String::from);
        ring_now(&now(&all, &[2, 5, 8], &[]));
        let up = |n: &str, l: &str| (n.to_string(), l.to_string());
        assert_eq!(
            links(&board().snapshot()),
            [
                up("desktop", "up"),
                up("laptop", "up"),
                up("tablet", "up"),
                up("phone", "pruned")
            ]
        );

        let lost = [String::from("tablet")];
        // Mid-request: marked lost at once.
        failover_event(&FailoverEvent::Lost {
            device: "tablet".into(),
            reason: "control connection lost".into(),
        });
        assert_eq!(board().snapshot()["devices"][2]["link"], "lost");
        failover_event(&FailoverEvent::Replanned {
            cause: ReplanCause::DeviceLost,
            devices: 2,
        });
        // After the request: the ring of two.
        ring_now(&now(&all[..2], &[3, 12], &lost));
        let s = board().snapshot();
        assert_eq!(s["devices"][2]["link"], "lost");
        assert_eq!(s["devices"][1]["window"], 12);
        assert_eq!(s["devices"][2]["window"], 0);
        let kinds: Vec<String> = std::iter::from_fn(|| changes.try_recv().ok())
            .filter(|m| m["type"] == "event")
            .map(|m| format!("{} {}", m["kind"].as_str().unwrap(), m["device"]))
            .collect();
        assert_eq!(kinds, ["lost \"tablet\"", "replanned null"]);

        failover_event(&FailoverEvent::Back {
            device: "tablet".into(),
        });
        ring_now(&now(&all, &[2, 5, 8], &[]));
        let s = board().snapshot();
        assert_eq!(s["devices"][2]["link"], "up");
        let kinds: Vec<String> = std::iter::from_fn(|| changes.try_recv().ok())
            .filter(|m| m["type"] == "event")
            .map(|m| m["kind"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kinds, ["back"]);
        assert_eq!(s["events"].as_array().unwrap().len(), 3);
        assert_eq!(s["events"][0]["kind"], "lost");
    }
}
