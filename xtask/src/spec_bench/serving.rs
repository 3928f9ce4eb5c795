//! `cargo xtask spec-bench --concurrency 2,4`: several requests at once, with and
//! without the draft, as the server generates them — the scheduler of `prima serve
//! --parallel N` (and of `prima apply`'s head) run in this process over a session of N
//! slots, or over a ring head of N slots whose links go through the delaying forwarders;
//! with the draft, every slot drafts and one batch verifies all the slots' drafts.
//!
//! Aggregate tok/s is every request's generated tokens over the wall time from the first
//! request to the last one's end (prompts included, as `bench-serve` measures it).

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use prima_abi::backend::BackendConfig;
use prima_abi::transport::TransportConfig;
use prima_cluster::prp::key::LinkSecurity;
use prima_cluster::prp::{NextRoute, RingHead, RingOptions};
use prima_core::batch::BatchRowLogits;
use prima_core::model::{Model, Session};
use prima_core::plugin::{load_backend, load_transport};
use prima_core::sampler::SamplerConfig;
use prima_core::speculative::DraftOptions;
use prima_core::tokenizer::Tokenizer;
use prima_server::{
    job_queue, run_scheduler, run_speculative_scheduler, Drafting, Event, GenerationRequest,
    Prompt, SchedulerOptions, Submitted,
};

const PROMPTS: &[&str] = &[
    "The history of the printing press begins in the fifteenth century, when",
    "Water boils at a temperature of",
    "A short poem about the sea:\n",
    "def fibonacci(n):",
    "The three primary colours are",
    "Here is a recipe for a simple bread. First,",
    "The capital of France is",
    "In a distant galaxy, a small robot",
];

const N_CTX: usize = 512;
const N_BATCH: usize = 512;

/// Where the ring's devices are: the forwarders the head reaches nodes 1 and 2 through,
/// the head's data listener and the forwarder node 2 reaches it through.
pub struct RingAddrs {
    pub nodes: [String; 2],
    pub head_listen: String,
    pub to_head: String,
}

/// One configuration's run: the text of each request, its generated tokens, the wall
/// time, and the drafted and accepted tokens (with a draft).
pub struct Served {
    pub texts: Vec<String>,
    pub tokens: usize,
    pub seconds: f64,
    pub drafted: usize,
    pub accepted: usize,
}

impl Served {
    pub fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }
}

/// The models and plugins every run uses.
pub struct Bench {
    target: Model,
    draft: Model,
    tokenizer: Tokenizer,
    backend: prima_core::plugin::LoadedBackend,
    transport: prima_core::plugin::LoadedTransport,
}

impl Bench {
    /// Loads the models and the `cpu` and `tcp` plugins from `plugins` (the release
    /// directory).
    pub fn open(target: &Path, draft: &Path, plugins: &Path, threads: u32) -> Result<Bench> {
        // This process is xtask, not prima: the plugins are where prima's build put them.
        std::env::set_var("PRIMA_PLUGIN_DIR", plugins);
        let target_model = Model::load(target)?;
        let tokenizer = Tokenizer::from_gguf(target_model.gguf())?;
        Ok(Bench {
            draft: Model::load(draft)?,
            tokenizer,
            target: target_model,
            backend: load_backend(Some("cpu"), BackendConfig { threads })
                .context("the cpu backend plugin")?,
            transport: load_transport(
                Some("tcp"),
                TransportConfig {
                    max_frame_bytes: 1 << 30,
                },
            )
            .context("the tcp transport plugin")?,
        })
    }

    /// `concurrency` requests at once, greedy, `n_predict` tokens each, on one device
    /// (`ring` `None`) or round the ring, drafting with `draft` when given.
    pub fn serve(
        &self,
        concurrency: usize,
        n_predict: usize,
        ring: Option<&RingAddrs>,
        draft: Option<DraftOptions>,
    ) -> Result<Served> {
        let be = &self.backend.backend;
        match ring {
            None => {
                let mut target =
                    Session::with_slots(&self.target, be, N_CTX, N_BATCH, concurrency)?;
                self.run(&mut target, concurrency, n_predict, draft)
            }
            Some(addrs) => {
                let options = RingOptions {
                    n_ctx: N_CTX,
                    n_batch: N_BATCH,
                    n_slots: concurrency,
                    listen: addrs.head_listen.clone(),
                    next_routes: vec![NextRoute::AsHead, NextRoute::Addr(addrs.to_head.clone())],
                    security: LinkSecurity::Insecure,
                    ..RingOptions::default()
                };
                let mut head = RingHead::connect(
                    &self.target,
                    be,
                    &self.transport.transport,
                    &addrs.nodes,
                    &[10, 10, 10],
                    &options,
                )?;
                let served = self.run(&mut head, concurrency, n_predict, draft);
                // The nodes go back to waiting for the next head.
                head.shutdown(false);
                served
            }
        }
    }

    fn run<T: BatchRowLogits>(
        &self,
        target: &mut T,
        concurrency: usize,
        n_predict: usize,
        draft: Option<DraftOptions>,
    ) -> Result<Served> {
        let (queue, jobs) = job_queue();
        let submitted: Vec<Submitted> = (0..concurrency)
            .map(|i| {
                queue.submit(GenerationRequest {
                    prompt: Prompt::Text(PROMPTS[i % PROMPTS.len()].into()),
                    max_tokens: Some(n_predict),
                    sampler: SamplerConfig {
                        temperature: 0.0,
                        ..SamplerConfig::default()
                    },
                    stop: Vec::new(),
                    ignore_eos: true,
                })
            })
            .collect::<Result<_, _>>()?;
        drop(queue);
        let options = SchedulerOptions::default();
        let started = Instant::now();
        match draft {
            Some(draft_options) => {
                let be = &self.backend.backend;
                let mut draft = Session::with_slots(&self.draft, be, N_CTX, N_BATCH, concurrency)?;
                let model = Drafting {
                    target,
                    draft: &mut draft,
                    options: draft_options,
                };
                run_speculative_scheduler(model, &self.tokenizer, jobs, options, |_| {});
            }
            None => run_scheduler(target, &self.tokenizer, jobs, options, |_| {}),
        }
        let seconds = started.elapsed().as_secs_f64();
        let mut served = Served {
            texts: Vec::new(),
            tokens: 0,
            seconds,
            drafted: 0,
            accepted: 0,
        };
        for mut s in submitted {
            let mut text = String::new();
            while let Ok(event) = s.events.try_recv() {
                match event {
                    Event::Text(t) => text.push_str(&t),
                    Event::Done(c) => {
                        served.tokens += c.usage.completion_tokens;
                        if let Some(d) = c.draft {
                            served.drafted += d.drafted;
                            served.accepted += d.accepted;
                        }
                    }
                    Event::Failed(e) => bail!("a request failed: {e}"),
                    Event::Started { .. } => {}
                }
            }
            served.texts.push(text);
        }
        Ok(served)
    }
}
