//! One snapshot of a process's memory mappings, shared by everything that
//! places the process's addresses as samples arrive (the unwinder, naming
//! from V8's heap, the symbolizer), so that an address none of them knows
//! costs one read of `/proc/<pid>/maps`, not one each.

use std::collections::HashSet;
use std::io;
use std::time::{Duration, Instant};

use otel_thread_ctx_reader::maps::{self, Mapping};

/// How often the maps may be re-read for an address no mapping covers.
pub const REFRESH_EVERY: Duration = Duration::from_millis(200);

/// Most addresses remembered as unmapped; all are forgotten past it.
const MAX_UNMAPPED: usize = 4096;

/// Whether a read of the maps could place `addr` as code: not in the first
/// page (the kernel maps nothing there), and not a word whose low half is
/// zero, which is how a V8 small integer looks on the stack (a walk that
/// went astray reads them as return addresses; an instruction after a call
/// all but never sits at a multiple of 4 GiB).
fn may_be_code(addr: u64) -> bool {
    addr >= 0x1000 && addr & 0xffff_ffff != 0
}

type Reader = Box<dyn FnMut() -> io::Result<Vec<Mapping>> + Send>;

/// The mappings of one process as last read, re-read (at most every
/// refresh interval) when an address none covers turns up: code mapped
/// since (dlopen) gets placed.
pub struct ProcessMaps {
    /// Sorted by start (the kernel lists them so); they never overlap.
    maps: Vec<Mapping>,
    read: Reader,
    refresh_every: Duration,
    /// When a read was last tried.
    refreshed: Instant,
    /// Counts the changes of `maps`: a user keeping state derived from
    /// them rebuilds it when this moves.
    generation: u64,
    /// Addresses no mapping covered right after a read. Reading again would
    /// most likely not place them either (a stack walk that went astray
    /// keeps producing the same bogus return address), so they trigger no
    /// read; a read another address triggers still places them.
    unmapped: HashSet<u64>,
}

impl ProcessMaps {
    /// The maps of process `pid`, as just read.
    pub fn new(pid: i32, maps: Vec<Mapping>) -> ProcessMaps {
        ProcessMaps::with_reader(maps, REFRESH_EVERY, move || maps::read(pid))
    }

    /// `maps` as just read, re-read with `read` at most every
    /// `refresh_every`.
    pub fn with_reader(
        mut maps: Vec<Mapping>,
        refresh_every: Duration,
        read: impl FnMut() -> io::Result<Vec<Mapping>> + Send + 'static,
    ) -> ProcessMaps {
        maps.sort_by_key(|m| m.start);
        ProcessMaps {
            maps,
            read: Box::new(read),
            refresh_every,
            refreshed: Instant::now(),
            generation: 0,
            unmapped: HashSet::new(),
        }
    }

    /// Maps a re-read finds unchanged (tests give their own).
    #[cfg(test)]
    pub(crate) fn fixed(maps: Vec<Mapping>) -> ProcessMaps {
        let copy = maps.clone();
        ProcessMaps::with_reader(maps, REFRESH_EVERY, move || Ok(copy.clone()))
    }

    /// Every mapping, by start address.
    pub fn mappings(&self) -> &[Mapping] {
        &self.maps
    }

    /// Changes each time a read finds the maps changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn index(&self, addr: u64) -> Option<usize> {
        // The last mapping starting at or below `addr`, if it reaches it.
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        (addr < self.maps[i].end).then_some(i)
    }

    /// The mapping that covers `addr` in the maps held.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        self.index(addr).map(|i| &self.maps[i])
    }

    /// The mapping that covers `addr`, the maps re-read first (as
    /// [`ProcessMaps::reread_for`] allows) when none held does.
    pub fn find_or_reread(&mut self, addr: u64) -> Option<&Mapping> {
        if self.index(addr).is_none() {
            self.reread_for(addr);
        }
        self.find(addr)
    }

    /// Re-reads the maps because no mapping covers `addr`: not when one
    /// does, when `addr` cannot be code, when a read was tried within the
    /// refresh interval, or when `addr` was left unmapped right after an
    /// earlier read. Returns whether the maps changed.
    pub fn reread_for(&mut self, addr: u64) -> bool {
        if self.index(addr).is_some()
            || !may_be_code(addr)
            || self.unmapped.contains(&addr)
            || self.refreshed.elapsed() < self.refresh_every
        {
            return false;
        }
        let changed = self.reread();
        if self.index(addr).is_none() {
            if self.unmapped.len() >= MAX_UNMAPPED {
                self.unmapped.clear();
            }
            self.unmapped.insert(addr);
        }
        changed
    }

    /// Reads the maps now, whatever the refresh interval. The maps held
    /// stay when the read fails or finds none (the process exited).
    /// Returns whether they changed.
    pub fn reread(&mut self) -> bool {
        self.refreshed = Instant::now();
        match (self.read)() {
            Ok(mut maps) if !maps.is_empty() => {
                maps.sort_by_key(|m| m.start);
                if maps == self.maps {
                    return false;
                }
                self.maps = maps;
                self.generation += 1;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    fn mapping(start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            perms: "r-xp".into(),
            offset: 0,
            inode: 0,
            path: String::new(),
        }
    }

    /// Maps whose reads return what `next` holds then, counted in `reads`.
    fn counted(
        initial: Vec<Mapping>,
        refresh_every: Duration,
    ) -> (ProcessMaps, Arc<Mutex<Vec<Mapping>>>, Arc<AtomicUsize>) {
        let next = Arc::new(Mutex::new(initial.clone()));
        let reads = Arc::new(AtomicUsize::new(0));
        let maps = {
            let (next, reads) = (next.clone(), reads.clone());
            ProcessMaps::with_reader(initial, refresh_every, move || {
                reads.fetch_add(1, Ordering::Relaxed);
                Ok(next.lock().unwrap().clone())
            })
        };
        (maps, next, reads)
    }

    #[test]
    fn finds_the_mapping_that_covers_an_address() {
        // Given out of order: kept by start.
        let maps = ProcessMaps::fixed(vec![
            mapping(0x5000, 0x6000),
            mapping(0x1000, 0x2000),
            mapping(0x2000, 0x3000),
        ]);
        let start = |addr| maps.find(addr).map(|m| m.start);
        assert_eq!(start(0), None);
        assert_eq!(start(0xfff), None);
        // Start inclusive, end exclusive, adjacent mappings apart.
        assert_eq!(start(0x1000), Some(0x1000));
        assert_eq!(start(0x1fff), Some(0x1000));
        assert_eq!(start(0x2000), Some(0x2000));
        assert_eq!(start(0x2fff), Some(0x2000));
        // A gap, the last mapping, past it.
        assert_eq!(start(0x3000), None);
        assert_eq!(start(0x4fff), None);
        assert_eq!(start(0x5000), Some(0x5000));
        assert_eq!(start(0x5fff), Some(0x5000));
        assert_eq!(start(0x6000), None);
        assert_eq!(start(u64::MAX), None);
        assert_eq!(ProcessMaps::fixed(Vec::new()).find(0x1000), None);
    }

    #[test]
    fn a_covered_address_reads_nothing() {
        let (mut maps, _, reads) = counted(vec![mapping(0x1000, 0x2000)], Duration::ZERO);
        assert!(maps.find_or_reread(0x1800).is_some());
        assert!(!maps.reread_for(0x1800));
        assert_eq!(reads.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_address_left_unmapped_by_a_read_triggers_no_other() {
        let (mut maps, _, reads) = counted(vec![mapping(0x1000, 0x2000)], Duration::ZERO);
        assert!(maps.find_or_reread(0x9000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        // The refresh interval is past (it is zero): only the address
        // remembered as unmapped keeps it from reading again.
        assert!(maps.find_or_reread(0x9000).is_none());
        assert!(!maps.reread_for(0x9000));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        // Another unmapped address reads once; the first still reads nothing.
        assert!(maps.find_or_reread(0xa000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 2);
        assert!(maps.find_or_reread(0x9000).is_none());
        assert!(maps.find_or_reread(0xa000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn an_address_that_cannot_be_code_reads_nothing() {
        let (mut maps, next, reads) = counted(vec![mapping(0x1000, 0x2000)], Duration::ZERO);
        // The first page, and V8 small integers as a walk gone astray
        // reads them (the value in the high half, zeros in the low).
        for addr in [0, 0x24, 0xfff, 0x1_0000_0000, 0x7f12_0000_0000] {
            assert!(maps.find_or_reread(addr).is_none(), "{addr:#x}");
        }
        assert_eq!(reads.load(Ordering::Relaxed), 0);
        // Mapped meanwhile, such an address is placed by a read another
        // address triggers.
        next.lock()
            .unwrap()
            .push(mapping(0x7f11_ffff_f000, 0x7f12_0000_1000));
        assert!(maps.find_or_reread(0x7f12_0000_0010).is_some());
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        assert!(maps.find(0x7f12_0000_0000).is_some());
    }

    #[test]
    fn no_read_within_the_refresh_interval() {
        let (mut maps, next, reads) =
            counted(vec![mapping(0x1000, 0x2000)], Duration::from_secs(3600));
        next.lock().unwrap().push(mapping(0x9000, 0xa000));
        // Just read (at creation): neither a new address nor the same one
        // reads before the interval is past.
        assert!(maps.find_or_reread(0x9000).is_none());
        assert!(maps.find_or_reread(0x9000).is_none());
        assert!(maps.find_or_reread(0xb000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 0);
        // Once past it, one read places the new mapping.
        maps.refresh_every = Duration::ZERO;
        assert_eq!(maps.find_or_reread(0x9000).map(|m| m.start), Some(0x9000));
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        // An address met within the interval is not remembered as
        // unmapped (no read looked for it): past it, it reads once, and
        // then no more.
        maps.refresh_every = Duration::from_secs(3600);
        assert!(maps.find_or_reread(0xb000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        maps.refresh_every = Duration::ZERO;
        assert!(maps.find_or_reread(0xb000).is_none());
        assert!(maps.find_or_reread(0xb000).is_none());
        assert_eq!(reads.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn code_mapped_later_is_placed_even_at_an_address_left_unmapped() {
        let (mut maps, next, reads) = counted(vec![mapping(0x1000, 0x2000)], Duration::ZERO);
        assert!(maps.find_or_reread(0x9100).is_none());
        // dlopen: a library now covers both addresses.
        next.lock().unwrap().push(mapping(0x9000, 0xa000));
        // The remembered address does not read, another one does, and
        // then both are placed.
        assert!(maps.find_or_reread(0x9100).is_none());
        assert_eq!(maps.find_or_reread(0x9200).map(|m| m.start), Some(0x9000));
        assert_eq!(maps.find(0x9100).map(|m| m.start), Some(0x9000));
        assert_eq!(reads.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_generation_moves_when_a_read_changes_the_maps() {
        let (mut maps, next, _) = counted(vec![mapping(0x1000, 0x2000)], Duration::ZERO);
        assert_eq!(maps.generation(), 0);
        // The same maps again: nothing to rebuild.
        assert!(!maps.reread());
        assert_eq!(maps.generation(), 0);
        next.lock().unwrap().push(mapping(0x3000, 0x4000));
        assert!(maps.reread_for(0x3000));
        assert_eq!(maps.generation(), 1);
        assert_eq!(maps.mappings().len(), 2);
        // A read that finds none (the process exited) keeps the maps.
        next.lock().unwrap().clear();
        assert!(!maps.reread());
        assert_eq!(maps.generation(), 1);
        assert_eq!(maps.mappings().len(), 2);
        next.lock().unwrap().push(mapping(0x5000, 0x6000));
        assert!(maps.reread());
        assert_eq!(maps.generation(), 2);
        assert_eq!(maps.mappings().len(), 1);
    }

    #[test]
    fn the_addresses_remembered_as_unmapped_are_bounded() {
        let (mut maps, _, reads) = counted(Vec::new(), Duration::ZERO);
        for i in 0..MAX_UNMAPPED as u64 + 1 {
            maps.reread_for(0x10_0000 + i);
        }
        assert!(maps.unmapped.len() <= MAX_UNMAPPED);
        assert_eq!(reads.load(Ordering::Relaxed), MAX_UNMAPPED + 1);
    }
}
