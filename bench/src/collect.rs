//! The main thread's side of a run: gathers the workers' per-second figures, prints each
//! second's lines once every live worker has reported it, keeps the series for the report
//! and the plot, and draws a progress line on stderr when stderr is a terminal.
//!
//! Sources are numbered: producers first (`0..producers`), then consumers. The only state
//! shared with the workers is the channel they report on.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use shardmq_protocol::remoting::response_code_name;

use crate::clock::RunClock;
use crate::consume_stats::{consume_line, end_to_end_line, ConsumeTally};
use crate::stats::{interval_line, per_second, LatencySummary, Tally};
use crate::worker::TICK;

/// A partial last second shorter than this is left out of the series (its rates would be
/// noise).
const TAIL_LENGTH_MIN: Duration = Duration::from_millis(50);
/// How often the progress line is redrawn.
const PROGRESS_REDRAW: Duration = Duration::from_millis(250);

/// A worker's counts.
#[derive(Debug)]
pub enum Figures {
    Send(Tally),
    Consume(ConsumeTally),
}

/// Messages from a worker to the main thread.
#[derive(Debug)]
pub enum Report {
    /// Everything counted during tick `tick` (`start + tick s .. start + (tick + 1) s`).
    Interval {
        source: usize,
        tick: u64,
        figures: Figures,
    },
    /// The worker stopped; `figures` holds what came after its last full tick.
    Done {
        source: usize,
        figures: Figures,
        finished_at: Instant,
        connections_lost: usize,
    },
}

/// Which latency a run is judged by (the plot's and the series' percentiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headline {
    /// Send round trips (producer mode).
    Send,
    /// Pull round trips (consumer mode).
    Pull,
    /// Intended send time to receipt (end-to-end mode).
    EndToEnd,
}

impl Headline {
    pub fn name(self) -> &'static str {
        match self {
            Headline::Send => "send latency",
            Headline::Pull => "pull round trip",
            Headline::EndToEnd => "end-to-end latency",
        }
    }
}

/// One second of the run.
#[derive(Debug, Clone, Copy)]
pub struct IntervalPoint {
    /// End of the interval, in seconds since the start (the last one may be partial).
    pub t_secs: f64,
    pub send_tps: f64,
    pub consume_tps: f64,
    /// Percentiles of the headline latency over this second.
    pub latency: LatencySummary,
}

/// Everything a run counted.
#[derive(Debug)]
pub struct Collected {
    pub send: Tally,
    pub consume: ConsumeTally,
    pub producers_finished_at: Option<Instant>,
    pub consumers_finished_at: Option<Instant>,
    pub producer_connections_lost: usize,
    pub consumer_connections_lost: usize,
    pub series: Vec<IntervalPoint>,
}

/// How to gather one run.
pub struct Collector<'a> {
    pub producers: usize,
    pub consumers: usize,
    pub headline: Headline,
    pub clock: RunClock,
    /// Planned length, for the progress line.
    pub planned: Option<Duration>,
    pub progress: bool,
    /// Called once every producer has stopped, with the messages they stored.
    pub on_producers_done: Option<Box<dyn FnOnce(u64, Instant) + 'a>>,
}

/// One second's figures while workers are still reporting it.
struct Pending {
    send: Tally,
    consume: ConsumeTally,
    reported: BTreeSet<usize>,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            send: Tally::new(),
            consume: ConsumeTally::new(),
            reported: BTreeSet::new(),
        }
    }
}

impl Collector<'_> {
    fn is_producer(&self, source: usize) -> bool {
        source < self.producers
    }

    /// Gathers reports until every worker is done.
    pub fn collect(mut self, receiver: &Receiver<Report>) -> Collected {
        let mut collected = Collected {
            send: Tally::new(),
            consume: ConsumeTally::new(),
            producers_finished_at: None,
            consumers_finished_at: None,
            producer_connections_lost: 0,
            consumer_connections_lost: 0,
            series: Vec::new(),
        };
        let mut live: BTreeSet<usize> = (0..self.producers + self.consumers).collect();
        let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
        let mut progress = Progress::new(self.progress);
        // What workers counted after their last full second.
        let mut tail = Pending::new();
        while !live.is_empty() {
            let report = match receiver.recv_timeout(PROGRESS_REDRAW) {
                Ok(report) => report,
                Err(RecvTimeoutError::Timeout) => {
                    progress.draw(&self.progress_text(&collected));
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match report {
                Report::Interval {
                    source,
                    tick,
                    figures,
                } => {
                    let entry = pending.entry(tick).or_insert_with(Pending::new);
                    merge_figures(&mut entry.send, &mut entry.consume, &figures);
                    entry.reported.insert(source);
                }
                Report::Done {
                    source,
                    figures,
                    finished_at,
                    connections_lost,
                } => {
                    live.remove(&source);
                    merge_figures(&mut tail.send, &mut tail.consume, &figures);
                    let new = merge_figures(&mut collected.send, &mut collected.consume, &figures);
                    print_first_remarks(&new, &collected, &mut progress);
                    let producers_left = (0..self.producers).any(|p| live.contains(&p));
                    // The seconds not every worker has reported yet are not in `collected`.
                    let pending_succeeded = pending.values().map(|p| p.send.succeeded).sum();
                    self.note_done(
                        source,
                        finished_at,
                        connections_lost,
                        producers_left,
                        pending_succeeded,
                        &mut collected,
                    );
                }
            }
            while let Some(entry) = pending.first_entry() {
                if !live.is_subset(&entry.get().reported) {
                    break;
                }
                let tick = *entry.key();
                self.complete_second(tick, entry.remove(), &mut collected, &mut progress);
            }
            progress.draw(&self.progress_text(&collected));
        }
        progress.clear();
        if let Some(point) = self.tail_point(&tail, &collected) {
            collected.series.push(point);
        }
        collected
    }

    /// Records that worker `source` stopped; the last producer to stop triggers
    /// `on_producers_done`, with every message stored: those of the seconds summed into
    /// `collected` and `pending_succeeded`, those of seconds some worker has not reported yet
    /// (counting only the first, the consumers stopped as soon as they had that many: a
    /// second the consumer had not reported when the producers ended went missing, and
    /// "N not received" was printed for messages that were never waited for).
    fn note_done(
        &mut self,
        source: usize,
        finished_at: Instant,
        connections_lost: usize,
        producers_left: bool,
        pending_succeeded: u64,
        collected: &mut Collected,
    ) {
        if !self.is_producer(source) {
            collected.consumer_connections_lost += connections_lost;
            collected.consumers_finished_at =
                collected.consumers_finished_at.max(Some(finished_at));
            return;
        }
        collected.producer_connections_lost += connections_lost;
        collected.producers_finished_at = collected.producers_finished_at.max(Some(finished_at));
        if !producers_left {
            if let Some(done) = self.on_producers_done.take() {
                done(collected.send.succeeded + pending_succeeded, finished_at);
            }
        }
    }

    /// Every live worker has reported second `tick`: add it to the totals, print its lines
    /// and add its point to the series.
    fn complete_second(
        &self,
        tick: u64,
        interval: Pending,
        collected: &mut Collected,
        progress: &mut Progress,
    ) {
        let mut new_codes: Vec<Code> = collected
            .send
            .merge(&interval.send)
            .into_iter()
            .map(Code::Send)
            .collect();
        new_codes.extend(
            collected
                .consume
                .merge(&interval.consume)
                .into_iter()
                .map(Code::Pull),
        );
        print_first_remarks(&new_codes, collected, progress);
        let point = self.print_interval(tick, &interval, collected, progress);
        collected.series.push(point);
    }

    /// The partial last second, when workers counted anything after their last full one.
    fn tail_point(&self, tail: &Pending, collected: &Collected) -> Option<IntervalPoint> {
        let finished = collected
            .producers_finished_at
            .max(collected.consumers_finished_at)?;
        let end = finished.saturating_duration_since(self.clock.start);
        let last = collected.series.last().map_or(0.0, |point| point.t_secs);
        let length = end.saturating_sub(Duration::from_secs_f64(last));
        let counted = tail.send.succeeded > 0 || tail.consume.messages > 0;
        if !counted || length < TAIL_LENGTH_MIN {
            return None;
        }
        Some(IntervalPoint {
            t_secs: end.as_secs_f64(),
            send_tps: per_second(tail.send.succeeded, length),
            consume_tps: per_second(tail.consume.messages, length),
            latency: self.headline_latency(tail),
        })
    }

    fn headline_latency(&self, figures: &Pending) -> LatencySummary {
        match self.headline {
            Headline::Send => LatencySummary::of(&figures.send.latency_us),
            Headline::Pull => LatencySummary::of(&figures.consume.pull_latency_us),
            Headline::EndToEnd => LatencySummary::of(&figures.consume.end_to_end_us),
        }
    }

    /// Prints one second's lines; returns its point of the series.
    fn print_interval(
        &self,
        tick: u64,
        interval: &Pending,
        collected: &Collected,
        progress: &mut Progress,
    ) -> IntervalPoint {
        progress.clear();
        if self.producers > 0 {
            println!("{}", interval_line(&interval.send, TICK, &collected.send));
        }
        if self.consumers > 0 {
            println!(
                "{}",
                consume_line(&interval.consume, TICK, &collected.consume)
            );
        }
        if self.headline == Headline::EndToEnd {
            println!("{}", end_to_end_line(&interval.consume));
        }
        let _ = std::io::stdout().flush();
        IntervalPoint {
            t_secs: (tick + 1) as f64,
            send_tps: per_second(interval.send.succeeded, TICK),
            consume_tps: per_second(interval.consume.messages, TICK),
            latency: self.headline_latency(interval),
        }
    }

    fn progress_text(&self, collected: &Collected) -> String {
        let elapsed = self.clock.start.elapsed().as_secs_f64();
        let planned = self
            .planned
            .map(|planned| format!("/{} s", planned.as_secs()))
            .unwrap_or_default();
        let mut text = format!("[{elapsed:5.1} s{planned}]");
        if self.producers > 0 {
            text.push_str(&format!(" sent {}", collected.send.succeeded));
        }
        if self.consumers > 0 {
            text.push_str(&format!(" received {}", collected.consume.messages));
        }
        if let Some(last) = collected.series.last() {
            let tps = if self.producers > 0 {
                last.send_tps
            } else {
                last.consume_tps
            };
            text.push_str(&format!(
                " | last second {tps:.0} msg/s, {} p99 {:.3} ms",
                self.headline.name(),
                last.latency.p99_us as f64 / 1000.0
            ));
        }
        text
    }
}

/// A failure code first seen, and where.
#[derive(Debug, Clone, Copy)]
enum Code {
    Send(i32),
    Pull(i32),
}

fn merge_figures(send: &mut Tally, consume: &mut ConsumeTally, figures: &Figures) -> Vec<Code> {
    match figures {
        Figures::Send(tally) => send.merge(tally).into_iter().map(Code::Send).collect(),
        Figures::Consume(tally) => consume.merge(tally).into_iter().map(Code::Pull).collect(),
    }
}

fn print_first_remarks(codes: &[Code], collected: &Collected, progress: &mut Progress) {
    for code in codes {
        progress.clear();
        let (what, code, remark) = match *code {
            Code::Send(code) => (
                "response",
                code,
                &collected.send.response_failures[&code].first_remark,
            ),
            Code::Pull(code) => (
                "pull answer",
                code,
                &collected.consume.pull_failures[&code].first_remark,
            ),
        };
        let name = response_code_name(code).unwrap_or("UNKNOWN");
        eprintln!("First {what} with code {code} ({name}): {remark:?}");
    }
}

/// The single updating line on stderr (only when stderr is a terminal).
struct Progress {
    enabled: bool,
    shown: bool,
}

impl Progress {
    fn new(wanted: bool) -> Progress {
        // SAFETY: isatty only inspects the descriptor.
        let terminal = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        Progress {
            enabled: wanted && terminal,
            shown: false,
        }
    }

    fn draw(&mut self, text: &str) {
        if self.enabled {
            eprint!("\r\x1b[K{text}");
            let _ = std::io::stderr().flush();
            self.shown = true;
        }
    }

    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
            self.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::mpsc;

    fn sent(succeeded: u64) -> Figures {
        let mut tally = Tally::new();
        tally.succeeded = succeeded;
        tally.requests = succeeded;
        Figures::Send(tally)
    }

    /// The producers' last seconds count toward what they stored even while the consumer has
    /// not reported those seconds yet (the consumers stop once they have that many).
    #[test]
    fn producers_done_counts_seconds_the_consumer_has_not_reported() {
        let (sender, receiver) = mpsc::channel();
        let now = Instant::now();
        sender
            .send(Report::Interval {
                source: 0,
                tick: 0,
                figures: sent(10),
            })
            .unwrap();
        sender
            .send(Report::Done {
                source: 0,
                figures: sent(2),
                finished_at: now,
                connections_lost: 0,
            })
            .unwrap();
        sender
            .send(Report::Interval {
                source: 1,
                tick: 0,
                figures: Figures::Consume(ConsumeTally::new()),
            })
            .unwrap();
        sender
            .send(Report::Done {
                source: 1,
                figures: Figures::Consume(ConsumeTally::new()),
                finished_at: now,
                connections_lost: 0,
            })
            .unwrap();
        drop(sender);
        let produced = Cell::new(None);
        let collected = Collector {
            producers: 1,
            consumers: 1,
            headline: Headline::EndToEnd,
            clock: RunClock::start_now(),
            planned: None,
            progress: false,
            on_producers_done: Some(Box::new(|count, _| produced.set(Some(count)))),
        }
        .collect(&receiver);
        assert_eq!(produced.get(), Some(12), "tick 0 was still pending");
        assert_eq!(collected.send.succeeded, 12);
    }
}
