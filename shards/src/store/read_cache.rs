//! Windows of durable commitlog bytes kept for pulls of cold data (a consumer catching up).
//!
//! The records of one queue lie among those of every other queue, so a pull of 32 records
//! read from disk was many small DMA reads, one per run of contiguous records, each awaited
//! in turn: a catch-up of 8 queues reached a third of the disk's sequential bandwidth. Pull
//! bodies now read whole windows (`WINDOW_BYTES`, aligned, inside one segment and wholly below
//! the in-memory tail, so their bytes never change), and the windows stay in a small per-store
//! cache that the pulls of the other queues, which are reading the same stretch of the log,
//! hit. A window is one DMA read, kept in the buffer it was read into (no zeroed buffer to
//! read into, no copy out: 0.82–0.85 of the broker's CPU for a catch-up, performance.md).
//! A window being read is read once: the pulls that need it meanwhile wait for that read.
//! Reading a window also starts reading the next one (`READ_AHEAD_WINDOWS`, in a background
//! task), so a consumer moving along the log finds it ready. More read ahead was slower here
//! (4 windows: 9–16 s for a 4 GiB catch-up that 1 window reads in 3.2 s). Read ahead pauses
//! when a pull misses a window evicted lately (the cache remembers twice as many as it
//! keeps): then the windows the pulls are reading do not all fit, and each read ahead would
//! evict one in use, to be read again (16 groups at 16 places in a 440 MB backlog read 152 GB
//! from disk in 54 s; paused, 7.4 GB in 5 s). Past as many places as it keeps windows, those
//! in use cannot all fit: evicting the least recently used one then evicts a window some
//! group still reads, and each such read evicts another (24 groups at 24 places read a 440 MB
//! backlog 150-350 times over). So while they do not fit, a pull's miss evicts only a window
//! nobody looked up for 128 lookups a window kept; with none, it reads only its own records'
//! span, past the cache (`Lookup::Bypass`): the groups whose windows are held keep them, the
//! others read what they need (24 groups: 8 s and 15 GB where it was 15-30 s and 34-70 GB).
//! The pulls of one group's queues, which a client sends together, read the same stretch of
//! the log: a span read past the cache serves every pull that needs bytes inside it while it
//! is being read or a pull holds it (`lookup_span`), and reaches a quarter past the reader's
//! own records, where the others' end (48 groups at 48 places: 0.65x the time and 0.56x the
//! bytes read from disk of spans of one pull each).
//!
//! Memory: at most `windows_max` windows (`StoreConfig::read_cache_windows`: 16 by default,
//! the tuning knob `store.read_cache_mib`), those cached and those being read together (a read
//! that starts evicts the least recently used window first; when every place is being read,
//! a pull reads past the cache and a read-ahead waits). A read past the cache holds at
//! most a window's bytes, for the pulls that hold it, and the reads past it hold at most 8
//! times the bytes of the windows together (`take_span`, given back when the last pull lets
//! go; a pull waits for room holding none, so they cannot wait for each other; bounded by the
//! windows' bytes alone, pulls waited for room: 48 groups at 48 places took 28-32 s where
//! they took 18-22 s). Their buffers come
//! from the memory each shard registers with io_uring (`runtime.io_memory_mib`, 24 MiB by
//! default, which holds the default 16 windows with room beside them) while it lasts, and
//! from the heap past it: fresh pages to fault in and clear for every window read, up to a
//! quarter of the broker's CPU a message under 16 lagging consumer groups (performance.md).
//! Lookups of single records (by offset, by id, by time) do not use it.
//!
//! A window also keeps where the records whose BODYCRC a pull found right start (pull.rs,
//! `vet_records`): its bytes never change, so the other groups' pulls of those records do not
//! compute it again (4-5% of a shard serving 16 lagging groups).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::{Rc, Weak};

use crate::hash::IntHash;
use crate::sync::Event;

/// Size of one window of the commitlog (a multiple of the block size).
pub const WINDOW_BYTES: u64 = 1 << 20;

/// Windows one store keeps by default (`StoreConfig::read_cache_windows`; the tuning knob
/// `store.read_cache_mib`), and the fewest it may keep.
pub const WINDOWS_DEFAULT: usize = 16;
pub const WINDOWS_MIN: usize = 4;

/// Windows read ahead of the one a pull reads (reads the disk works on at once).
pub const READ_AHEAD_WINDOWS: usize = 1;

const _: () = assert!(READ_AHEAD_WINDOWS < WINDOWS_MIN / 2);

/// Windows evicted last that the cache remembers (not their bytes), per window it keeps: a
/// pull's miss on one of them says the windows in use do not all fit.
const EVICTED_REMEMBERED_PER_WINDOW: usize = 2;

/// Misses during which read ahead stays off after a pull missed a window evicted lately,
/// per window kept.
const READ_AHEAD_PAUSE_MISSES_PER_WINDOW: u64 = 4;

/// Lookups after which a window nobody looked up is no longer in use, per window kept: while
/// the windows in use do not fit, a pull's miss evicts only such a window (or reads past the
/// cache).
///
/// Large enough for the groups a window is held for to come back to it while the others'
/// pulls read past the cache (32 a window let 1.4-1.9x as many windows held be evicted and
/// read again, 32 groups at 32 places).
const IN_USE_LOOKUPS_PER_WINDOW: u64 = 128;

/// Bytes the pulls' reads past the cache may hold together, per window the cache keeps: a
/// bound on what many pulls at many places hold at once, which normal loads do not reach.
const SPAN_BYTES_PER_WINDOW: u64 = 8 * WINDOW_BYTES;

/// A window's bytes: those its DMA read brought in, in their buffer (any byte slice in tests).
pub(crate) type WindowBytes = Rc<Window>;

/// The bytes of one window, and which of its records had their body checked.
pub(crate) struct Window {
    bytes: Box<dyn std::ops::Deref<Target = [u8]>>,
    /// Where the records whose BODYCRC was found right start. A window's bytes never
    /// change, so a record is checked once per window read, not once per pull of it
    /// (sixteen consumer groups pull every record of a window).
    crc_checked: RefCell<HashSet<u32, IntHash>>,
}

impl Window {
    pub(crate) fn new(bytes: impl std::ops::Deref<Target = [u8]> + 'static) -> WindowBytes {
        Rc::new(Window {
            bytes: Box::new(bytes),
            crc_checked: RefCell::default(),
        })
    }

    /// Whether the record at `offset` of the window had its BODYCRC checked.
    pub(crate) fn crc_checked(&self, offset: usize) -> bool {
        self.crc_checked.borrow().contains(&(offset as u32))
    }

    /// Notes that the record at `offset` of the window has a right BODYCRC.
    pub(crate) fn note_crc_checked(&self, offset: usize) {
        self.crc_checked.borrow_mut().insert(offset as u32);
    }

    /// Bytes of the set of checked records.
    fn crc_checked_bytes(&self) -> usize {
        self.crc_checked.borrow().capacity() * (std::mem::size_of::<u32>() + 1)
    }
}

impl std::ops::Deref for Window {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// What the cache says of a window.
pub(crate) enum Lookup {
    Cached(WindowBytes),
    /// Being read: wait for the event, then look again.
    Reading(Rc<Event>),
    /// Neither: the caller reads it (and has been registered as its reader).
    Missing,
    /// Neither, and no room for it: every place holds a window in use or being read. The
    /// caller reads only the bytes it needs, past the cache ([`ReadCache::lookup_span`]).
    Bypass,
}

/// What the cache knows of the reads past it that hold a commitlog offset.
pub(crate) enum SpanLookup {
    /// A span some pull still holds: its start and bytes.
    Held(u64, WindowBytes),
    /// A span being read: [`SpanRead::wait`] for it.
    Reading(u64, Rc<SpanRead>),
    /// None: the caller reads its own ([`ReadCache::start_span`]).
    None,
}

/// A span being read past the cache: what wakes the pulls waiting for it, and its bytes for
/// them once read. The reader runs on first once its read is done and, its pull answered,
/// may let go of the bytes before the others wake: so the bytes wait here for them, held
/// until the last of them is back.
#[derive(Default)]
pub(crate) struct SpanRead {
    done: Event,
    finished: std::cell::Cell<bool>,
    bytes: RefCell<Option<WindowBytes>>,
}

impl SpanRead {
    /// The span's bytes once read; None when its read failed, or the store was emptied
    /// meanwhile (look again).
    pub(crate) async fn wait(&self) -> Option<WindowBytes> {
        if !self.finished.get() {
            self.done.wait().await;
        }
        self.bytes.borrow().clone()
    }

    fn finish(&self) {
        self.finished.set(true);
        self.done.notify();
    }
}

/// A read past the cache, by its start: its end, and its bytes while a pull holds them.
enum Span {
    Reading(u64, Rc<SpanRead>),
    Read(u64, Weak<Window>),
}

impl Span {
    fn end(&self) -> u64 {
        match self {
            Span::Reading(end, _) | Span::Read(end, _) => *end,
        }
    }
}

pub(crate) struct ReadCache {
    /// Windows kept at most, cached and being read together.
    windows_max: usize,
    /// Window start (commitlog offset) → its bytes and when they were last used.
    windows: HashMap<u64, (WindowBytes, u64), IntHash>,
    reading: HashMap<u64, Rc<Event>, IntHash>,
    uses: u64,
    /// Moves when the store is emptied (`forget_all`): a read begun before brings back bytes
    /// of the old log, which it must not leave here.
    generation: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// Starts of the windows evicted last, oldest first (at most `evicted_remembered()`).
    evicted: VecDeque<u64>,
    /// Read ahead is off until `misses` reaches this.
    read_ahead_paused_until: u64,
    /// Pulls' misses on windows evicted lately, and read aheads not made for them.
    pub(crate) misses_evicted_lately: u64,
    pub(crate) read_aheads_paused: u64,
    /// Pulls' misses told to read past the cache ([`Lookup::Bypass`]).
    pub(crate) bypasses: u64,
    /// Bytes of the reads past the cache that pulls hold ([`ReadCache::take_span`]), and
    /// what wakes the pulls waiting for room among them.
    span_bytes: u64,
    spans_freed: Rc<Event>,
    /// The reads past the cache that pulls hold or are reading, by start (each inside one
    /// window): a pull that needs bytes inside one takes it instead of reading them again.
    /// The pulls of one group's queues read the same stretch of the log, each its own span
    /// of it (with 8 queues, each span 8 times the records it serves).
    spans: BTreeMap<u64, Span>,
    /// Pulls past the cache that took a span another pull read.
    pub(crate) span_shares: u64,
}

impl Default for ReadCache {
    fn default() -> ReadCache {
        ReadCache::new(WINDOWS_DEFAULT)
    }
}

impl ReadCache {
    /// A cache of at most `windows_max` windows (at least `WINDOWS_MIN`, which
    /// `StoreConfig::validate` checks before a store opens).
    pub(crate) fn new(windows_max: usize) -> ReadCache {
        ReadCache {
            windows_max,
            windows: HashMap::default(),
            reading: HashMap::default(),
            uses: 0,
            generation: 0,
            hits: 0,
            misses: 0,
            evicted: VecDeque::new(),
            read_ahead_paused_until: 0,
            misses_evicted_lately: 0,
            read_aheads_paused: 0,
            bypasses: 0,
            span_bytes: 0,
            spans_freed: Rc::default(),
            spans: BTreeMap::new(),
            span_shares: 0,
        }
    }

    /// The read past the cache that holds commitlog offset `at`, if a pull holds one or is
    /// reading one.
    pub(crate) fn lookup_span(&mut self, at: u64) -> SpanLookup {
        // Spans lie inside one window: one holding `at` starts at most a window before it.
        let found = self
            .spans
            .range(at.saturating_sub(WINDOW_BYTES)..=at)
            .rev()
            .filter(|(_, span)| span.end() > at)
            .find_map(|(start, span)| match span {
                Span::Reading(_, read) => Some(SpanLookup::Reading(*start, read.clone())),
                Span::Read(_, bytes) => Some(SpanLookup::Held(*start, bytes.upgrade()?)),
            });
        found.unwrap_or(SpanLookup::None)
    }

    /// A pull took the bytes of a span another pull read (counted here, not at the lookup:
    /// a waiter whose read failed looks again and takes nothing).
    pub(crate) fn took_span(&mut self) {
        self.span_shares += 1;
    }

    /// Registers the caller as the reader of the span `[start, end)` past the cache (which
    /// [`ReadCache::lookup_span`] found nobody holding or reading); it then calls
    /// [`ReadCache::finish_span`]. Returns the generation to pass there.
    pub(crate) fn start_span(&mut self, start: u64, end: u64) -> u64 {
        self.spans.insert(start, Span::Reading(end, Rc::default()));
        self.generation
    }

    /// The read of the span at `start`, begun at `generation`, ended: the other pulls may take
    /// its bytes (when it succeeded) while a pull holds them, and whoever waits for it looks
    /// again.
    pub(crate) fn finish_span(&mut self, start: u64, bytes: Option<&WindowBytes>, generation: u64) {
        if generation != self.generation {
            return;
        }
        let end = match self.spans.get(&start) {
            Some(Span::Reading(end, read)) => {
                // For the pulls waiting (only then: the last reference to the bytes must not
                // go while the cache is borrowed, as the room they take is given back here).
                if Rc::strong_count(read) > 1 {
                    *read.bytes.borrow_mut() = bytes.cloned();
                }
                read.finish();
                *end
            }
            _ => return,
        };
        match bytes {
            Some(bytes) => self
                .spans
                .insert(start, Span::Read(end, Rc::downgrade(bytes))),
            None => self.spans.remove(&start),
        };
    }

    /// Takes room for a read of `bytes` past the cache: the pulls' reads past it hold at
    /// most `SPAN_BYTES_PER_WINDOW` a window kept (one larger read alone goes ahead). False:
    /// wait for `spans_freed` and try again.
    pub(crate) fn take_span(&mut self, bytes: u64) -> bool {
        let max = SPAN_BYTES_PER_WINDOW * self.windows_max as u64;
        if self.span_bytes > 0 && self.span_bytes + bytes > max {
            return false;
        }
        self.span_bytes += bytes;
        true
    }

    /// Gives back what [`ReadCache::take_span`] took for the span at `start`, whose last
    /// holder let go of it, and wakes the pulls waiting for room.
    pub(crate) fn release_span(&mut self, start: u64, bytes: u64) {
        self.span_bytes -= bytes;
        self.spans_freed.notify();
        if matches!(self.spans.get(&start), Some(Span::Read(_, held)) if held.strong_count() == 0) {
            self.spans.remove(&start);
        }
    }

    /// What wakes a pull waiting for room for a read past the cache.
    pub(crate) fn spans_freed(&self) -> Rc<Event> {
        self.spans_freed.clone()
    }

    fn evicted_remembered(&self) -> usize {
        EVICTED_REMEMBERED_PER_WINDOW * self.windows_max
    }

    fn in_use_lookups(&self) -> u64 {
        IN_USE_LOOKUPS_PER_WINDOW * self.windows_max as u64
    }

    /// Bytes of the windows held.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.windows
            .values()
            .map(|(window, _)| (window.len() + window.crc_checked_bytes()) as u64)
            .sum()
    }

    /// Looks up the window at `start`; a miss registers the caller as its reader, who must
    /// then call [`ReadCache::finish`].
    pub(crate) fn lookup(&mut self, start: u64) -> Lookup {
        self.uses += 1;
        if let Some((bytes, last_use)) = self.windows.get_mut(&start) {
            *last_use = self.uses;
            self.hits += 1;
            return Lookup::Cached(bytes.clone());
        }
        if let Some(event) = self.reading.get(&start) {
            return Lookup::Reading(event.clone());
        }
        self.misses += 1;
        // A window evicted lately is needed again: the windows the pulls are reading do not
        // all fit, and reading others ahead would evict those in use (16 groups at 16 places
        // in a backlog read it 400 times over). Read ahead waits until that has passed.
        if self.evicted.contains(&start) {
            self.misses_evicted_lately += 1;
            self.read_ahead_paused_until =
                self.misses + READ_AHEAD_PAUSE_MISSES_PER_WINDOW * self.windows_max as u64;
        }
        if !self.make_room_for_a_read() {
            self.bypasses += 1;
            return Lookup::Bypass;
        }
        self.reading.insert(start, Rc::default());
        Lookup::Missing
    }

    /// Whether the windows the pulls read lately did not all fit (read ahead is paused).
    fn overfull(&self) -> bool {
        self.misses < self.read_ahead_paused_until
    }

    /// Evicts least recently used windows until one more read keeps the windows cached and
    /// being read within `windows_max`; false when every place is being read. While the
    /// windows in use do not fit, it evicts only a window not looked up for
    /// `in_use_lookups()` (false otherwise: a pull then reads past the cache, and read ahead
    /// is paused anyway): evicting the least recently used one then evicts a window some
    /// group still reads, which reads it again and evicts another's (24 groups at 24 places
    /// read a 440 MB backlog hundreds of times over).
    fn make_room_for_a_read(&mut self) -> bool {
        while self.windows.len() + self.reading.len() >= self.windows_max {
            let Some((oldest, last_use)) = self.least_recently_used() else {
                return false;
            };
            if self.overfull() && last_use + self.in_use_lookups() > self.uses {
                return false;
            }
            self.evict(oldest);
        }
        true
    }

    /// Evicts the cached window used least recently; false when none is cached.
    fn evict_least_recently_used(&mut self) -> bool {
        let Some((oldest, _)) = self.least_recently_used() else {
            return false;
        };
        self.evict(oldest);
        true
    }

    /// The start and last use of the cached window used least recently.
    fn least_recently_used(&self) -> Option<(u64, u64)> {
        self.windows
            .iter()
            .min_by_key(|(_, (_, last_use))| *last_use)
            .map(|(start, (_, last_use))| (*start, *last_use))
    }

    fn evict(&mut self, start: u64) {
        self.windows.remove(&start);
        if self.evicted.len() >= self.evicted_remembered() {
            self.evicted.pop_front();
        }
        self.evicted.push_back(start);
    }

    /// Whether the window at `start` is cached or being read.
    pub(crate) fn holds(&self, start: u64) -> bool {
        self.windows.contains_key(&start) || self.reading.contains_key(&start)
    }

    /// Registers a read-ahead of the window at `start` (false: already there or under way, or
    /// read ahead is paused).
    pub(crate) fn start_read_ahead(&mut self, start: u64) -> bool {
        if self.holds(start) {
            return false;
        }
        if self.overfull() {
            self.read_aheads_paused += 1;
            return false;
        }
        if !self.make_room_for_a_read() {
            return false;
        }
        self.reading.insert(start, Rc::default());
        true
    }

    /// What a reader passes to [`ReadCache::finish`]: taken when its read starts.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The read of the window at `start`, begun at `generation`, ended: keeps its bytes (when
    /// it succeeded) and wakes whoever waits for it. A read begun before `forget_all` leaves
    /// nothing (its waiters were woken then).
    pub(crate) fn finish(&mut self, start: u64, bytes: Option<WindowBytes>, generation: u64) {
        if generation != self.generation {
            return;
        }
        if let Some(bytes) = bytes {
            if self.windows.len() >= self.windows_max {
                self.evict_least_recently_used();
            }
            self.uses += 1;
            self.windows.insert(start, (bytes, self.uses));
        }
        if let Some(event) = self.reading.remove(&start) {
            event.notify();
        }
    }

    /// Forgets windows below `offset` (their segments were deleted), and the spans read
    /// past the cache there.
    pub(crate) fn forget_below(&mut self, offset: u64) {
        self.windows.retain(|start, _| *start >= offset);
        self.spans
            .retain(|start, span| *start >= offset || matches!(span, Span::Reading(..)));
    }

    /// Forgets every window, and the reads under way (their waiters look again and read
    /// the window themselves): the store was emptied, its log starts anew. Counts stay.
    pub(crate) fn forget_all(&mut self) {
        self.windows.clear();
        self.evicted.clear();
        for (_, event) in self.reading.drain() {
            event.notify();
        }
        for (_, span) in std::mem::take(&mut self.spans) {
            if let Span::Reading(_, read) = span {
                read.finish();
            }
        }
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(bytes: Vec<u8>) -> WindowBytes {
        Window::new(bytes)
    }

    #[test]
    fn keeps_the_recent_windows_and_reads_each_once() {
        let mut cache = ReadCache::default();
        assert!(matches!(cache.lookup(0), Lookup::Missing));
        assert!(
            matches!(cache.lookup(0), Lookup::Reading(_)),
            "a second pull waits for the read under way"
        );
        cache.finish(0, Some(window(vec![1])), 0);
        assert!(matches!(cache.lookup(0), Lookup::Cached(bytes) if bytes[0] == 1));
        assert!(cache.start_read_ahead(WINDOW_BYTES));
        assert!(!cache.start_read_ahead(WINDOW_BYTES));
        cache.finish(WINDOW_BYTES, None, 0);
        assert!(!cache.holds(WINDOW_BYTES), "a failed read keeps nothing");
        for i in 1..=WINDOWS_DEFAULT as u64 {
            assert!(matches!(cache.lookup(i * WINDOW_BYTES), Lookup::Missing));
            cache.finish(i * WINDOW_BYTES, Some(window(vec![0])), 0);
        }
        assert_eq!(cache.windows.len(), WINDOWS_DEFAULT);
        assert!(!cache.holds(0), "the least recently used window went");
        cache.forget_below(4 * WINDOW_BYTES);
        assert!(cache.windows.keys().all(|start| *start >= 4 * WINDOW_BYTES));
    }

    #[test]
    fn windows_cached_and_being_read_stay_within_the_limit() {
        let mut cache = ReadCache::default();
        for i in 0..WINDOWS_DEFAULT as u64 - 2 {
            assert!(matches!(cache.lookup(i * WINDOW_BYTES), Lookup::Missing));
            cache.finish(i * WINDOW_BYTES, Some(window(vec![0])), 0);
        }
        assert!(
            matches!(cache.lookup(0), Lookup::Cached(_)),
            "window 0 is used again"
        );
        let far = 100 * WINDOW_BYTES;
        for i in 0..4 {
            assert!(matches!(
                cache.lookup(far + i * WINDOW_BYTES),
                Lookup::Missing
            ));
            assert!(cache.windows.len() + cache.reading.len() <= WINDOWS_DEFAULT);
        }
        assert!(cache.holds(0), "the window used last stays");
        assert!(
            !cache.holds(WINDOW_BYTES) && !cache.holds(2 * WINDOW_BYTES),
            "reads that start evict the least recently used windows first"
        );
        let mut started = 4;
        while cache.start_read_ahead(far + started * WINDOW_BYTES) {
            started += 1;
        }
        assert!(cache.windows.is_empty(), "read-ahead evicts what is cached");
        assert_eq!(
            cache.reading.len(),
            WINDOWS_DEFAULT,
            "and stops when every place is read"
        );
        assert!(
            matches!(cache.lookup(2 * far), Lookup::Bypass),
            "a pull then reads past the cache"
        );
        assert_eq!(cache.reading.len(), WINDOWS_DEFAULT);
        assert_eq!(cache.bypasses, 1);
    }

    #[test]
    fn a_miss_on_a_window_evicted_lately_pauses_read_ahead() {
        let mut cache = ReadCache::default();
        let read = |cache: &mut ReadCache, i: u64| match cache.lookup(i * WINDOW_BYTES) {
            Lookup::Missing => cache.finish(i * WINDOW_BYTES, Some(window(vec![0])), 0),
            // (Paused, the windows used lately keep their places.)
            lookup => assert!(matches!(lookup, Lookup::Bypass) && cache.overfull()),
        };
        // One reader moving along the log: windows go, none is needed again, read ahead on.
        for i in 0..3 * WINDOWS_DEFAULT as u64 {
            read(&mut cache, i);
        }
        assert_eq!(cache.misses_evicted_lately, 0);
        assert!(cache.start_read_ahead(1000 * WINDOW_BYTES));
        cache.finish(1000 * WINDOW_BYTES, None, 0);
        // A window evicted lately is needed again: the windows in use do not fit.
        let evicted = 2 * WINDOWS_DEFAULT as u64;
        assert!(!cache.holds(evicted * WINDOW_BYTES));
        read(&mut cache, evicted);
        assert_eq!(cache.misses_evicted_lately, 1);
        assert!(!cache.start_read_ahead(1001 * WINDOW_BYTES), "paused");
        assert_eq!(cache.read_aheads_paused, 1);
        // Until that many more misses have passed without another such one.
        for i in 0..READ_AHEAD_PAUSE_MISSES_PER_WINDOW * WINDOWS_DEFAULT as u64 - 1 {
            read(&mut cache, 2000 + i);
            assert!(!cache.start_read_ahead(1001 * WINDOW_BYTES), "still paused");
        }
        read(&mut cache, 3000);
        assert!(cache.start_read_ahead(1001 * WINDOW_BYTES), "on again");
    }

    #[test]
    fn while_the_windows_in_use_do_not_fit_a_miss_evicts_only_one_no_longer_in_use() {
        let mut cache = ReadCache::default();
        let read = |cache: &mut ReadCache, i: u64| {
            let lookup = cache.lookup(i * WINDOW_BYTES);
            if matches!(lookup, Lookup::Missing) {
                cache.finish(i * WINDOW_BYTES, Some(window(vec![0])), 0);
            }
            lookup
        };
        // Groups at more places than there are windows, each reading its own over and over.
        let places = WINDOWS_DEFAULT as u64 + 8;
        for _ in 0..3 {
            for place in 0..places {
                read(&mut cache, place);
            }
        }
        assert!(
            cache.misses_evicted_lately > 0,
            "the windows in use do not fit"
        );
        let bypasses = cache.bypasses;
        let misses = cache.misses;
        for _ in 0..20 {
            for place in 0..places {
                read(&mut cache, place);
            }
        }
        assert!(
            cache.bypasses - bypasses >= 8 * 20 - 8,
            "the places without a window read past the cache"
        );
        assert!(
            cache.hits >= (WINDOWS_DEFAULT as u64 - 1) * 20,
            "the others keep theirs: {} hits",
            cache.hits
        );
        assert!(cache.misses - misses <= 8 * 20 + 8);
        // A window nobody reads any more gives its place.
        let held: Vec<u64> = cache.windows.keys().copied().collect();
        let idle = held[0];
        let mut far = 1000;
        while cache.holds(idle) {
            for start in &held[1..] {
                assert!(matches!(cache.lookup(*start), Lookup::Cached(_)));
            }
            read(&mut cache, far);
            far += 1;
        }
        assert!(
            far - 1000
                <= 2 * IN_USE_LOOKUPS_PER_WINDOW * WINDOWS_DEFAULT as u64 / WINDOWS_DEFAULT as u64,
            "after {} lookups",
            far - 1000
        );
        assert!(
            cache.holds((far - 1) * WINDOW_BYTES),
            "for the window missed then"
        );
    }

    #[test]
    fn reads_past_the_cache_hold_a_bounded_number_of_bytes() {
        let mut cache = ReadCache::new(WINDOWS_MIN);
        let max = WINDOWS_MIN as u64 * SPAN_BYTES_PER_WINDOW;
        assert!(cache.take_span(max - WINDOW_BYTES));
        assert!(cache.take_span(WINDOW_BYTES));
        assert!(!cache.take_span(4096), "full");
        let freed = cache.spans_freed();
        let woken = freed.wait();
        cache.release_span(0, WINDOW_BYTES);
        assert!(
            futures_lite::future::block_on(futures_lite::future::poll_once(woken)).is_some(),
            "a pull waiting for room is woken"
        );
        assert!(!cache.take_span(WINDOW_BYTES + 1));
        assert!(cache.take_span(WINDOW_BYTES));
        cache.release_span(0, max);
        assert!(cache.take_span(2 * max), "one larger read alone goes ahead");
    }

    #[test]
    fn a_span_read_past_the_cache_serves_the_pulls_inside_it_while_one_holds_it() {
        let mut cache = ReadCache::default();
        let (start, end) = (8 * WINDOW_BYTES + 4096, 8 * WINDOW_BYTES + 65536);
        assert!(matches!(cache.lookup_span(start), SpanLookup::None));
        let generation = cache.start_span(start, end);
        let SpanLookup::Reading(at, read) = cache.lookup_span(end - 1) else {
            panic!("a pull inside the span waits for its read");
        };
        assert_eq!(at, start);
        assert!(
            matches!(cache.lookup_span(end), SpanLookup::None),
            "not one past its end"
        );
        assert!(matches!(cache.lookup_span(start - 1), SpanLookup::None));
        let bytes = window(vec![7; (end - start) as usize]);
        cache.finish_span(start, Some(&bytes), generation);
        drop(bytes);
        let waited = futures_lite::future::block_on(futures_lite::future::poll_once(read.wait()));
        let waited = waited
            .flatten()
            .expect("the waiter gets the bytes, though the reader let go");
        assert_eq!(waited[0], 7);
        let SpanLookup::Held(at, shared) = cache.lookup_span(start + 100) else {
            panic!("a pull inside it takes it while one holds it");
        };
        assert!(at == start && Rc::ptr_eq(&shared, &waited));
        assert_eq!(
            cache.span_shares, 0,
            "a lookup takes nothing: pulls count what they take"
        );
        // Its last holder lets go: the room goes back, and nobody finds it any more.
        drop((shared, waited, read));
        assert!(cache.take_span(end - start));
        cache.release_span(start, end - start);
        assert!(cache.spans.is_empty(), "forgotten");
        assert!(matches!(cache.lookup_span(start), SpanLookup::None));
        // A failed read leaves nothing, and wakes its waiters.
        let generation = cache.start_span(start, end);
        let SpanLookup::Reading(_, read) = cache.lookup_span(start) else {
            panic!("being read");
        };
        cache.finish_span(start, None, generation);
        let waited = futures_lite::future::block_on(futures_lite::future::poll_once(read.wait()));
        assert!(matches!(waited, Some(None)), "woken, with nothing");
        assert!(matches!(cache.lookup_span(start), SpanLookup::None));
        // With nobody waiting, the bytes are not kept for anyone.
        let generation = cache.start_span(start, end);
        let bytes = window(vec![9; 10]);
        cache.finish_span(start, Some(&bytes), generation);
        assert_eq!(Rc::strong_count(&bytes), 1);
        drop(bytes);
        cache.spans.clear();
        // A read begun before the store was emptied leaves nothing either.
        let generation = cache.start_span(start, end);
        cache.forget_all();
        assert!(matches!(cache.lookup_span(start), SpanLookup::None));
        let bytes = window(vec![1; (end - start) as usize]);
        cache.finish_span(start, Some(&bytes), generation);
        assert!(matches!(cache.lookup_span(start), SpanLookup::None));
    }

    #[test]
    fn a_read_begun_before_the_store_was_emptied_leaves_nothing() {
        let mut cache = ReadCache::default();
        cache.finish(0, Some(window(vec![1])), cache.generation());
        assert!(matches!(cache.lookup(WINDOW_BYTES), Lookup::Missing));
        let before = cache.generation();
        let Lookup::Reading(event) = cache.lookup(WINDOW_BYTES) else {
            panic!("the window is being read");
        };
        let woken = event.wait();
        cache.forget_all();
        assert!(!cache.holds(0) && !cache.holds(WINDOW_BYTES));
        assert!(
            futures_lite::future::block_on(futures_lite::future::poll_once(woken)).is_some(),
            "a waiter of the forgotten read looks again"
        );
        cache.finish(WINDOW_BYTES, Some(window(vec![2])), before);
        assert!(matches!(cache.lookup(WINDOW_BYTES), Lookup::Missing));
        cache.finish(WINDOW_BYTES, Some(window(vec![3])), cache.generation());
        assert!(matches!(cache.lookup(WINDOW_BYTES), Lookup::Cached(bytes) if bytes[0] == 3));
    }
}
