//! [`run_worker`]: the scheduler with one slot, for any [`Forward`].

use prima_core::generate::Forward;
use prima_core::tokenizer::Tokenizer;

use crate::one_slot::OneSlot;
use crate::queue::JobReceiver;
use crate::scheduler::{run_scheduler, SchedulerOptions};

/// Serves jobs one at a time on this thread until every [`JobQueue`] is dropped: the
/// scheduler over a [`OneSlot`] (`--parallel 1`).
pub fn run_worker<F: Forward>(forward: &mut F, tokenizer: &Tokenizer, jobs: JobReceiver) {
    run_worker_with(forward, tokenizer, jobs, |_| {});
}

/// [`run_worker`], calling `after_job` with the model after every job that ran.
pub fn run_worker_with<F: Forward>(
    forward: &mut F,
    tokenizer: &Tokenizer,
    jobs: JobReceiver,
    mut after_job: impl FnMut(&mut F),
) {
    let mut one = OneSlot::new(forward);
    run_scheduler(
        &mut one,
        tokenizer,
        jobs,
        SchedulerOptions::default(),
        |one| after_job(one.inner()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Event, FinishReason, GenerationRequest, Prompt, Usage, WorkerError};
    use crate::queue::testing::{letters, outcome};
    use crate::queue::{job_queue, Submitted};
    use prima_core::sampler::SamplerConfig;

    /// A model that always continues the alphabet and ends after "z"; it records what it
    /// was asked to evaluate.
    struct Alphabet {
        n_ctx: usize,
        n_past: usize,
        evaluated: Vec<Vec<u32>>,
        logits: Vec<f32>,
    }

    impl Alphabet {
        fn new(n_ctx: usize) -> Alphabet {
            Alphabet {
                n_ctx,
                n_past: 0,
                evaluated: Vec::new(),
                logits: vec![0.0; 27],
            }
        }
    }

    impl Forward for Alphabet {
        type Error = std::io::Error;

        fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], std::io::Error> {
            if self.n_past + tokens.len() > self.n_ctx {
                return Err(std::io::Error::other("context full"));
            }
            self.n_past += tokens.len();
            self.evaluated.push(tokens.to_vec());
            let last = *tokens.last().unwrap();
            let next = if last == 26 { 0 } else { last + 1 };
            self.logits.fill(0.0);
            self.logits[next as usize] = 1.0;
            Ok(&self.logits)
        }

        fn n_past(&self) -> usize {
            self.n_past
        }

        fn n_ctx(&self) -> usize {
            self.n_ctx
        }

        fn truncate(&mut self, n: usize) -> Result<(), std::io::Error> {
            self.n_past = self.n_past.min(n);
            Ok(())
        }
    }

    fn text(prompt: &str, max_tokens: usize, stop: &[&str]) -> GenerationRequest {
        GenerationRequest {
            prompt: Prompt::Text(prompt.into()),
            max_tokens: Some(max_tokens),
            sampler: SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ignore_eos: false,
        }
    }

    /// Runs `requests` through one worker; returns each job's events and the model.
    fn serve(n_ctx: usize, requests: Vec<GenerationRequest>) -> (Vec<Vec<Event>>, Alphabet) {
        let tok = letters();
        let mut model = Alphabet::new(n_ctx);
        let (queue, jobs) = job_queue();
        let mut submitted: Vec<Submitted> = requests
            .into_iter()
            .map(|r| queue.submit(r).unwrap())
            .collect();
        drop(queue);
        run_worker(&mut model, &tok, jobs);
        let events = submitted
            .iter_mut()
            .map(|s| std::iter::from_fn(|| s.events.try_recv().ok()).collect())
            .collect();
        (events, model)
    }

    #[test]
    fn limits_stop_strings_and_end_of_generation_set_the_finish_reason() {
        let (events, _) = serve(
            64,
            vec![
                text("abc", 5, &[]),
                text("abc", 10, &["fg"]),
                text("wx", 10, &[]),
            ],
        );
        let (t, c) = outcome(&events[0]);
        assert_eq!(
            (t.as_str(), c.finish_reason),
            ("defgh", FinishReason::Length)
        );
        assert_eq!(
            c.usage,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 5
            }
        );
        let (t, c) = outcome(&events[1]);
        assert_eq!((t.as_str(), c.finish_reason), ("de", FinishReason::Stop));
        let (t, c) = outcome(&events[2]);
        assert_eq!((t.as_str(), c.finish_reason), ("yz", FinishReason::Stop));
    }

    #[test]
    fn a_request_that_continues_the_last_one_evaluates_only_what_is_new() {
        let (events, model) = serve(64, vec![text("abc", 5, &[]), text("abcdefgq", 2, &[])]);
        let (_, first) = outcome(&events[0]);
        assert_eq!(first.cached_prompt_tokens, 0);
        let (t, second) = outcome(&events[1]);
        assert_eq!(t, "rs");
        // "abc" + "defg" were evaluated ("h" was sampled last and never fed back).
        assert_eq!(second.cached_prompt_tokens, 7);
        assert_eq!(model.evaluated[model.evaluated.len() - 2], vec![17]); // "q"
    }

    #[test]
    fn a_repeated_prompt_still_evaluates_its_last_token() {
        let (events, model) = serve(64, vec![text("abc", 1, &[]), text("abc", 1, &[])]);
        assert_eq!(outcome(&events[1]).0, "d");
        assert_eq!(outcome(&events[1]).1.cached_prompt_tokens, 2);
        assert_eq!(model.evaluated.last().unwrap(), &vec![3]); // "c"
    }

    #[test]
    fn a_prompt_that_fills_the_context_is_refused_before_it_starts() {
        let (events, model) = serve(4, vec![text("abcd", 1, &[]), text("abc", 5, &[])]);
        assert!(
            matches!(
                events[0].as_slice(),
                [Event::Failed(WorkerError::PromptTooLong {
                    prompt_tokens: 4,
                    n_ctx: 4
                })]
            ),
            "{:?}",
            events[0]
        );
        // The next one runs until the context is full.
        let (t, c) = outcome(&events[1]);
        assert_eq!((t.as_str(), c.finish_reason), ("d", FinishReason::Length));
        assert_eq!(model.n_past, 3);
    }

    #[test]
    fn cancelled_and_closed_jobs_never_reach_the_model() {
        let tok = letters();
        let mut model = Alphabet::new(64);
        let (queue, jobs) = job_queue();
        let gone = queue.submit(text("abc", 3, &[])).unwrap();
        drop(gone); // the client left while queued
        let mut refused = queue.submit(text("abc", 3, &[])).unwrap();
        queue.close();
        assert!(matches!(
            queue.submit(text("abc", 3, &[])),
            Err(WorkerError::ShuttingDown)
        ));
        drop(queue);
        run_worker(&mut model, &tok, jobs);
        assert!(model.evaluated.is_empty());
        assert!(matches!(
            refused.events.try_recv(),
            Ok(Event::Failed(WorkerError::ShuttingDown))
        ));
    }
}
