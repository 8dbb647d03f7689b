//! V8's perf map (`/tmp/perf-<pid>.map`, written with `--perf-basic-prof`):
//! lines `START SIZE name`, in hexadecimal, appended as code is created.
//!
//! V8 reuses code space, so one address can fall into several entries; the
//! newest (last in the file) describes the code that lives there now.
//!
//! Names are read without V8's tier marker (see [`function_name`]), so that
//! every output names one function the same way.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufRead};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

/// The perf map path of a process: its `/tmp/perf-<pid>.map` as the
/// process itself sees it, so that a process in a container (its own mount
/// and pid namespaces) is named too; the host's `/tmp` when that path is
/// not there (the process exited, or /proc/<pid>/root cannot be read).
pub fn path(pid: i32) -> PathBuf {
    let host = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let Some(own) = own_pid(pid) else {
        return host;
    };
    if own == pid as u32 && same_mounts(pid) {
        return host;
    }
    let inside = PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{own}.map"));
    if inside.exists() {
        inside
    } else {
        host
    }
}

/// Whether process `pid` sees the same mounts as this one (its own mount
/// namespace, as a container has, has its own `/tmp`); yes when that cannot
/// be read.
fn same_mounts(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    match (id(&format!("/proc/{pid}/ns/mnt")), id("/proc/self/ns/mnt")) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => true,
    }
}

/// The pid `pid` has in its own pid namespace (the last of `NSpid`).
fn own_pid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// One line's entry: `[start, start + size)` holds code named `name` (as
/// written, with V8's marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    pub start: u64,
    pub size: u64,
    pub name: &'a str,
}

/// Parses one line of a perf map; `None` for a malformed line or an entry
/// of no size.
pub fn parse_line(line: &str) -> Option<Line<'_>> {
    let mut parts = line.splitn(3, ' ');
    let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
    let name = parts.next()?.trim();
    (size > 0).then_some(Line { start, size, name })
}

/// Larger than any code object V8 makes: an entry this large is not V8's,
/// and would name every sampled address at once.
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// How many (entry, address) matches one resolution follows at most: a
/// map written to make every entry cover every sampled address stops
/// there instead of costing their product.
pub const MAX_MATCHES: u64 = 5_000_000;

/// What a perf map says of some addresses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Each address some entry covers, named by the newest such entry.
    pub names: HashMap<u64, String>,
    /// The map held more matches than [`MAX_MATCHES`]: lines past them
    /// were not read.
    pub truncated: bool,
}

/// Longest line read: V8 writes a function's name and its script's URL.
/// A longer line is not V8's, and is skipped whole without being held.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How one call of [`read_line`] ended.
struct LineRead {
    /// Bytes taken from the reader (0: at its end).
    consumed: u64,
    /// The line ended in a newline (else it is still being written).
    complete: bool,
    /// Past [`MAX_LINE_BYTES`]: its bytes were not kept.
    too_long: bool,
}

/// Reads one line into `line`, keeping at most [`MAX_LINE_BYTES`] of it.
fn read_line(map: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<LineRead> {
    line.clear();
    let mut read = LineRead {
        consumed: 0,
        complete: false,
        too_long: false,
    };
    loop {
        let buf = map.fill_buf()?;
        if buf.is_empty() {
            return Ok(read);
        }
        let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if !read.too_long {
            if line.len() + take > MAX_LINE_BYTES {
                read.too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(&buf[..take]);
            }
        }
        map.consume(take);
        read.consumed += take as u64;
        if complete {
            read.complete = true;
            return Ok(read);
        }
    }
}

/// The entry a line read holds, if any: UTF-8, well formed, and no larger
/// than a code object.
fn entry_of(bytes: &[u8]) -> Option<Line<'_>> {
    let text = std::str::from_utf8(bytes).ok()?;
    parse_line(text.trim_end_matches(['\n', '\r'])).filter(|e| e.size <= MAX_ENTRY_BYTES)
}

/// Names each address in `addrs` by the newest entry of the perf map read
/// from `map` that covers it. The map is read line by line and never held:
/// it grows for the life of the process (every code creation appends a
/// line), so memory follows the addresses asked about, not the file.
/// Lines that are not UTF-8 or not entries are skipped.
pub fn resolve(map: impl BufRead, addrs: &[u64]) -> io::Result<Resolved> {
    let mut sorted: Vec<u64> = addrs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Shared names: a match costs a count, not a copy of the name.
    let mut names: HashMap<u64, Rc<str>> = HashMap::new();
    let mut truncated = false;
    let mut budget = MAX_MATCHES;
    let mut map = map;
    let mut bytes = Vec::new();
    loop {
        let read = read_line(&mut map, &mut bytes)?;
        if read.consumed == 0 {
            break;
        }
        if read.too_long {
            continue;
        }
        let Some(entry) = entry_of(&bytes) else {
            continue;
        };
        let end = entry.start.saturating_add(entry.size);
        let first = sorted.partition_point(|&a| a < entry.start);
        let mut name: Option<Rc<str>> = None;
        // A later entry overwrites what an earlier one said: V8 reuses code
        // memory.
        for &a in sorted[first..].iter().take_while(|&&a| a < end) {
            if budget == 0 {
                truncated = true;
                break;
            }
            budget -= 1;
            let name = name.get_or_insert_with(|| Rc::from(function_name(entry.name)));
            names.insert(a, name.clone());
        }
        if truncated {
            break;
        }
    }
    Ok(Resolved {
        names: names.into_iter().map(|(a, n)| (a, n.to_string())).collect(),
        truncated,
    })
}

/// Most code ranges a [`Follower`] keeps for one process. V8's live code
/// is far less; a map that needs more is read whole at each resolution
/// instead (as [`resolve`] does), so memory stays bounded.
pub const MAX_FOLLOWED_RANGES: usize = 1 << 18;

/// Most bytes of names a [`Follower`] keeps for one process, under the
/// same rule.
pub const MAX_FOLLOWED_NAME_BYTES: usize = 16 << 20;

/// Ranges a [`Follower`] holds before it drops those of code that is no
/// longer mapped (checked again each time they double).
const FIRST_PRUNE_AT: usize = 1 << 16;

/// A perf map's code ranges as its newest entries say, without overlaps:
/// `start -> (end, name)`.
#[derive(Default)]
struct Ranges {
    by_start: BTreeMap<u64, Code>,
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
    /// Bytes of `names`, and `names`' length and bytes at the last compaction.
    name_bytes: usize,
    compacted_names: usize,
    compacted_bytes: usize,
}

#[derive(Clone, Copy)]
struct Code {
    end: u64,
    name: u32,
}

impl Ranges {
    fn name_id(&mut self, name: &str) -> u32 {
        let name = function_name(name);
        if let Some(&id) = self.ids.get(name.as_ref()) {
            return id;
        }
        let shared: Arc<str> = Arc::from(name.as_ref());
        let id = self.names.len() as u32;
        self.name_bytes += shared.len();
        self.names.push(shared.clone());
        self.ids.insert(shared, id);
        id
    }

    /// `[start, end)` now holds `name`'s code: whatever an older entry said
    /// of those bytes is cut away.
    fn insert(&mut self, start: u64, end: u64, name: &str) {
        let name = self.name_id(name);
        if let Some((&before, &code)) = self.by_start.range(..start).next_back() {
            if code.end > start {
                self.by_start.insert(before, Code { end: start, ..code });
                if code.end > end {
                    self.by_start.insert(end, code);
                }
            }
        }
        while let Some((&inside, &code)) = self.by_start.range(start..end).next() {
            self.by_start.remove(&inside);
            if code.end > end {
                self.by_start.insert(end, code);
            }
        }
        self.by_start.insert(start, Code { end, name });
        if self.names.len() >= 2 * self.compacted_names + 4096
            || self.name_bytes >= 2 * self.compacted_bytes + (1 << 20)
        {
            self.compact_names();
        }
    }

    /// Forgets the names no range holds any more (code V8 replaced).
    fn compact_names(&mut self) {
        let mut new_id = vec![u32::MAX; self.names.len()];
        let mut names = Vec::new();
        for code in self.by_start.values_mut() {
            let slot = &mut new_id[code.name as usize];
            if *slot == u32::MAX {
                *slot = names.len() as u32;
                names.push(self.names[code.name as usize].clone());
            }
            code.name = *slot;
        }
        self.ids = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        self.name_bytes = names.iter().map(|n| n.len()).sum();
        self.names = names;
        self.compacted_names = self.names.len();
        self.compacted_bytes = self.name_bytes;
    }

    /// Keeps only the ranges that overlap one of `mapped` (sorted,
    /// `[start, end)`): code whose memory is gone (a worker's isolate that
    /// exited, a code space V8 released) can no longer be sampled.
    fn retain_mapped(&mut self, mapped: &[(u64, u64)]) {
        let mut next = 0;
        self.by_start.retain(|&start, code| {
            while next < mapped.len() && mapped[next].1 <= start {
                next += 1;
            }
            // The first mapping ending past `start` may still begin after it.
            (next..mapped.len())
                .take_while(|&i| mapped[i].0 < code.end)
                .any(|i| mapped[i].1 > start)
        });
        self.compact_names();
    }

    fn name_at(&self, addr: u64) -> Option<&Arc<str>> {
        let (_, code) = self.by_start.range(..=addr).next_back()?;
        (addr < code.end).then(|| &self.names[code.name as usize])
    }

    /// Past the bounds, counting only the names some range still holds.
    fn too_large(&mut self) -> bool {
        if self.name_bytes > MAX_FOLLOWED_NAME_BYTES {
            self.compact_names();
        }
        self.by_start.len() > MAX_FOLLOWED_RANGES || self.name_bytes > MAX_FOLLOWED_NAME_BYTES
    }
}

/// One process's perf map, followed as it grows: each resolution reads
/// only the lines appended since the last one, where [`resolve`] reads the
/// whole map again. For a daemon that names a process's samples every few
/// seconds for as long as it runs.
///
/// - only whole lines are taken: a line still being written is read with
///   the next resolution;
/// - the map is kept open, so the last samples of a process that exited
///   are named too;
/// - a map replaced at its path (a new process under a reused pid) or
///   truncated is read again from its start;
/// - ranges of code no longer in the process's memory are dropped as they
///   pile up: a process whose workers come and go writes each new
///   isolate's code at new addresses, and the map never says it is gone.
pub struct Follower {
    /// Whose map ([`path`]), or the map's own path.
    pid: i32,
    at: Option<PathBuf>,
    /// The map open, its (device, inode), and how far it was read.
    file: Option<(File, (u64, u64))>,
    offset: u64,
    /// The rest of a line too long to keep is skipped at the next read.
    skipping: bool,
    ranges: Ranges,
    /// When `ranges` grows past this, ranges outside the process's
    /// current mappings are dropped.
    prune_at: usize,
    /// Past the bounds: the whole map is read at each resolution.
    too_large: bool,
}

impl Follower {
    /// Follows the perf map of process `pid` ([`path`]); nothing is read yet.
    pub fn new(pid: i32) -> Follower {
        Follower::following(pid, None)
    }

    /// Follows the perf map at `path`.
    pub fn at(path: PathBuf) -> Follower {
        Follower::following(0, Some(path))
    }

    fn following(pid: i32, at: Option<PathBuf>) -> Follower {
        Follower {
            pid,
            at,
            file: None,
            offset: 0,
            skipping: false,
            ranges: Ranges::default(),
            prune_at: FIRST_PRUNE_AT,
            too_large: false,
        }
    }

    /// Whether the map outgrew what is kept, and is read whole each time.
    pub fn reads_whole_map(&self) -> bool {
        self.too_large
    }

    /// Names each address in `addrs` by the newest entry covering it, after
    /// reading what the map gained since the last call. An error when the
    /// map cannot be read (the process writes none).
    pub fn resolve(&mut self, addrs: &[u64]) -> io::Result<Resolved> {
        self.read_new_lines()?;
        if self.too_large {
            use std::io::{Seek, SeekFrom};
            let Some((file, _)) = self.file.as_mut() else {
                return Ok(Resolved::default());
            };
            file.seek(SeekFrom::Start(0))?;
            return resolve(io::BufReader::with_capacity(1 << 16, &*file), addrs);
        }
        let names = addrs
            .iter()
            .filter_map(|&a| self.ranges.name_at(a).map(|n| (a, n.to_string())))
            .collect();
        Ok(Resolved {
            names,
            truncated: false,
        })
    }

    /// Drops the ranges outside the process's mappings now. The lines read
    /// so far were written before this moment, so a range they describe
    /// that is not mapped now is code that is gone. Nothing is dropped when
    /// the mappings cannot be read (the process exited, or a map followed
    /// by path alone).
    fn prune(&mut self) {
        let maps = if self.pid > 0 {
            otel_thread_ctx_reader::maps::read(self.pid).unwrap_or_default()
        } else {
            Vec::new()
        };
        if !maps.is_empty() {
            let mut mapped: Vec<(u64, u64)> = maps.iter().map(|m| (m.start, m.end)).collect();
            mapped.sort_unstable();
            self.ranges.retain_mapped(&mapped);
        }
        self.prune_at = (2 * self.ranges.by_start.len()).max(FIRST_PRUNE_AT);
    }

    /// The map at its path now, opened again when it is another file than
    /// the one held; the one held when the path is gone (the process exited).
    fn current_file(&mut self) -> io::Result<File> {
        use std::os::unix::fs::MetadataExt;

        let map = match &self.at {
            Some(at) => at.clone(),
            None => path(self.pid),
        };
        match std::fs::metadata(&map) {
            Ok(meta) => {
                let identity = (meta.dev(), meta.ino());
                if self.file.as_ref().map(|(_, held)| *held) != Some(identity) {
                    let file = File::open(&map)?;
                    let meta = file.metadata()?;
                    *self = Follower::following(self.pid, self.at.take());
                    self.file = Some((file, (meta.dev(), meta.ino())));
                }
            }
            Err(error) if self.file.is_none() => return Err(error),
            Err(_) => {}
        }
        match &self.file {
            // Another descriptor of the file held, read apart from `self`.
            Some((file, _)) => file.try_clone(),
            None => Err(io::ErrorKind::NotFound.into()),
        }
    }

    fn read_new_lines(&mut self) -> io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};

        let mut file = self.current_file()?;
        let len = file.metadata()?.len();
        if len < self.offset {
            // Truncated: written again from its start.
            let held = self.file.take();
            *self = Follower::following(self.pid, self.at.take());
            self.file = held;
        }
        if self.too_large || len == self.offset {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        // Up to the size seen now: lines written meanwhile wait for the next call.
        let mut map = io::BufReader::with_capacity(1 << 16, file.take(len - self.offset));
        let mut bytes = Vec::new();
        loop {
            let read = read_line(&mut map, &mut bytes)?;
            if read.consumed == 0 {
                return Ok(());
            }
            if !read.complete {
                // Still being written: read again next time, unless it is
                // already too long to keep.
                if read.too_long {
                    self.offset += read.consumed;
                    self.skipping = true;
                }
                return Ok(());
            }
            self.offset += read.consumed;
            if std::mem::take(&mut self.skipping) || read.too_long {
                continue;
            }
            let Some(entry) = entry_of(&bytes) else {
                continue;
            };
            self.ranges.insert(
                entry.start,
                entry.start.saturating_add(entry.size),
                entry.name,
            );
            if self.ranges.by_start.len() > self.prune_at {
                self.prune();
            }
            if self.ranges.too_large() {
                self.ranges = Ranges::default();
                self.too_large = true;
                return Ok(());
            }
        }
    }
}

/// A JavaScript function's name without the marker V8 puts before it, which
/// says how that copy of its code was compiled, not which function it is:
/// the same function shows under several markers as V8 recompiles it during
/// the run, and would otherwise split one call path into several frames.
/// The `JS:` (or `Eval:`) tag stays: it tells JavaScript from native frames.
///
/// The forms each Node.js line writes with `--perf-basic-prof`:
/// - 20 and 22: `~` (Ignition bytecode), `^` (Sparkplug), `*` (TurboFan);
/// - 24: those, `+` (Maglev), and `*'`, `+'` (code specialized to one
///   function context);
/// - 26: `~`, `^`, `*'`, `+'`, and `o*`, `o+` (on-stack replacement code,
///   entered in the middle of a running loop).
///
/// `Eval:~` names eval'd code on every line; a function V8 will not optimize
/// is written with no marker at all.
pub fn function_name(name: &str) -> Cow<'_, str> {
    const TIERS: [char; 4] = ['~', '^', '+', '*'];
    let Some((tag, rest)) = ["JS:", "Eval:"]
        .iter()
        .find_map(|tag| name.strip_prefix(tag).map(|rest| (*tag, rest)))
    else {
        return name.into();
    };
    // `o` counts only before a tier: it also starts function names.
    let osr = rest.strip_prefix('o').filter(|r| r.starts_with(TIERS));
    let rest = osr.unwrap_or(rest);
    let Some(tier) = rest.chars().next().filter(|c| TIERS.contains(c)) else {
        return name.into();
    };
    let rest = &rest[1..];
    let rest = match tier {
        '+' | '*' => rest.strip_prefix('\'').unwrap_or(rest),
        _ => rest,
    };
    format!("{tag}{rest}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
1000 100 JS:~startup /app/boot.js:1:1
2000 40 Builtin:ArgumentsAdaptorTrampoline
garbage line
1080 20 JS:*handler /app/server.js:10:3
3000 0 empty
1000 10 JS:^lazy /app/x.js:2:2
";

    #[test]
    fn parses_entries_and_skips_garbage() {
        let e: Vec<Line> = MAP.lines().filter_map(parse_line).collect();
        assert_eq!(e.len(), 4);
        assert_eq!(
            e[0],
            Line {
                start: 0x1000,
                size: 0x100,
                name: "JS:~startup /app/boot.js:1:1"
            }
        );
        assert_eq!(e[3].name, "JS:^lazy /app/x.js:2:2");
    }

    /// Every marker form a Node.js line wrote for one function names it the
    /// same way.
    fn one_name(forms: &[&str]) {
        for form in forms {
            assert_eq!(
                function_name(&format!("{form}burnCpuHot /app/hot.js:1:20")),
                format!(
                    "{}burnCpuHot /app/hot.js:1:20",
                    &form[..form.find(':').unwrap() + 1]
                ),
                "{form}"
            );
        }
    }

    #[test]
    fn node_20_and_22_tiers() {
        one_name(&["JS:~", "JS:^", "JS:*", "Eval:~"]);
    }

    #[test]
    fn node_24_tiers_and_context_specialized_code() {
        one_name(&["JS:~", "JS:^", "JS:+", "JS:*", "JS:+'", "JS:*'", "Eval:~"]);
    }

    #[test]
    fn node_26_on_stack_replacement_code() {
        one_name(&["JS:~", "JS:^", "JS:+'", "JS:*'", "JS:o+", "JS:o*", "Eval:~"]);
    }

    #[test]
    fn only_the_marker_is_removed() {
        for name in [
            "JS:~once node:events:657:44",
            "JS:once node:events:657:44",
            "JS:o /a.js:1:1",
            "JS:~ node:internal/main/run_main_module:1:1",
            "Builtin:ArgumentsAdaptorTrampoline",
            "BytecodeHandler:Star0",
            "uv_run",
        ] {
            let want = name.replacen(":~", ":", 1);
            assert_eq!(function_name(name), want.as_str(), "{name}");
        }
        // A quote is a marker only after the optimizing tiers.
        assert_eq!(function_name("JS:~'q /a.js:1:1"), "JS:'q /a.js:1:1");
    }

    #[test]
    fn a_real_map_names_each_function_once() {
        // One function's entries, in the forms Node.js 24 and 26 write.
        let text = "\
7f1b0c004040 11c JS:~burnCpuHot /app/hot.js:1:20
7f1b0c00c280 148 JS:^burnCpuHot /app/hot.js:1:20
7f1b0c044e00 4cc JS:+burnCpuHot /app/hot.js:1:20
7f1b0c045400 2a8 JS:+'burnCpuHot /app/hot.js:1:20
7f1b0c046000 2a8 JS:*burnCpuHot /app/hot.js:1:20
7f1b0c047000 2a8 JS:*'burnCpuHot /app/hot.js:1:20
7faf4a840040 4cc JS:o+burnCpuHot /app/hot.js:1:20
7faf4a803ac0 2a8 JS:o*burnCpuHot /app/hot.js:1:20
";
        let starts: Vec<u64> = text
            .lines()
            .filter_map(parse_line)
            .map(|e| e.start)
            .collect();
        let r = resolve(text.as_bytes(), &starts).unwrap();
        let names: std::collections::HashSet<&String> = r.names.values().collect();
        assert_eq!(
            names,
            [&"JS:burnCpuHot /app/hot.js:1:20".to_string()].into()
        );
    }

    #[test]
    fn the_newest_covering_entry_wins() {
        let resolved = resolve(
            MAP.as_bytes(),
            &[0x1004, 0x1085, 0x10f0, 0x2010, 0x2040, 0x10],
        )
        .unwrap();
        assert!(!resolved.truncated);
        let r = resolved.names;
        // 0x1004: covered by startup (oldest) and lazy (newest).
        assert_eq!(r[&0x1004], "JS:lazy /app/x.js:2:2");
        // 0x1085: startup, then handler reused that space.
        assert_eq!(r[&0x1085], "JS:handler /app/server.js:10:3");
        assert_eq!(r[&0x10f0], "JS:startup /app/boot.js:1:1");
        assert_eq!(r[&0x2010], "Builtin:ArgumentsAdaptorTrampoline");
        // One past the end, and below every entry: unnamed.
        assert!(!r.contains_key(&0x2040));
        assert!(!r.contains_key(&0x10));
    }

    /// A scratch file for a follower, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let path = std::env::temp_dir()
                .join(format!("perf-map-test-{}-{name}.map", std::process::id()));
            std::fs::write(&path, "").unwrap();
            Scratch(path)
        }

        fn append(&self, text: &[u8]) {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&self.0)
                .unwrap();
            f.write_all(text).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn names_of(f: &mut Follower, addrs: &[u64]) -> HashMap<u64, String> {
        f.resolve(addrs).unwrap().names
    }

    #[test]
    fn a_follower_reads_what_was_appended_and_the_newest_entry_wins() {
        let map = Scratch::new("appended");
        let mut f = Follower::at(map.0.clone());
        let addrs = [0x1004, 0x1085, 0x10f0, 0x2010, 0x2040, 0x10];
        assert!(names_of(&mut f, &addrs).is_empty());
        // The same map as the streaming test, in three appends; the second
        // ends in the middle of a line.
        let text = MAP.as_bytes();
        let cut = MAP.find("1080").unwrap() + 6;
        map.append(&text[..40]);
        map.append(&text[40..cut]);
        let early = names_of(&mut f, &addrs);
        assert_eq!(
            early[&0x1085], "JS:startup /app/boot.js:1:1",
            "the half-written line is not read yet"
        );
        map.append(&text[cut..]);
        assert_eq!(
            names_of(&mut f, &addrs),
            resolve(text, &addrs).unwrap().names
        );
        // Later code over the same bytes.
        map.append(b"1080 10 JS:*again /app/y.js:3:3\n");
        let r = names_of(&mut f, &addrs);
        assert_eq!(r[&0x1085], "JS:again /app/y.js:3:3");
        assert_eq!(r[&0x1004], "JS:lazy /app/x.js:2:2");
        assert!(!f.reads_whole_map());
    }

    #[test]
    fn a_follower_cuts_older_ranges_around_newer_code() {
        let map = Scratch::new("cuts");
        map.append(b"1000 100 JS:~outer /a.js:1:1\n1040 20 JS:~inner /b.js:1:1\n0f00 110 JS:~low /c.js:1:1\n10f8 10 JS:~high /d.js:1:1\n");
        let mut f = Follower::at(map.0.clone());
        let addrs: Vec<u64> = (0xef0..0x1110).step_by(4).collect();
        assert_eq!(
            names_of(&mut f, &addrs),
            resolve(
                std::fs::File::open(&map.0)
                    .map(std::io::BufReader::new)
                    .unwrap(),
                &addrs
            )
            .unwrap()
            .names
        );
    }

    #[test]
    fn a_replaced_or_truncated_map_is_read_from_its_start() {
        let map = Scratch::new("replaced");
        map.append(b"1000 100 JS:~old /a.js:1:1\n");
        let mut f = Follower::at(map.0.clone());
        assert_eq!(names_of(&mut f, &[0x1010])[&0x1010], "JS:old /a.js:1:1");
        // Truncated in place and written again, shorter.
        std::fs::write(&map.0, b"2000 10 JS:~n /n.js:1:1\n").unwrap();
        let r = names_of(&mut f, &[0x1010, 0x2004]);
        assert!(!r.contains_key(&0x1010));
        assert_eq!(r[&0x2004], "JS:n /n.js:1:1");
        // Replaced by another file under the same path.
        let other = map.0.with_extension("new");
        std::fs::write(&other, b"3000 10 JS:~replaced /r.js:1:1\n").unwrap();
        std::fs::rename(&other, &map.0).unwrap();
        let r = names_of(&mut f, &[0x2004, 0x3004]);
        assert!(!r.contains_key(&0x2004));
        assert_eq!(r[&0x3004], "JS:replaced /r.js:1:1");
        // Removed: the file held still names.
        std::fs::remove_file(&map.0).unwrap();
        assert_eq!(
            names_of(&mut f, &[0x3004])[&0x3004],
            "JS:replaced /r.js:1:1"
        );
    }

    #[test]
    fn a_process_in_its_own_mount_namespace_is_named_from_its_own_tmp() {
        // A private /tmp, as a container has; skipped where this cannot be
        // set up (not root, no unshare).
        let mut child = match std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs none /tmp && echo '1000 10 JS:~inside /c.js:1:1' > /tmp/perf-$$.map && echo ready && exec sleep 30")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(_) => return,
        };
        let mut ready = String::new();
        let _ = std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        );
        let pid = child.id() as i32;
        let found = (ready.trim() == "ready").then(|| {
            let mut f = Follower::new(pid);
            (path(pid), f.resolve(&[0x1004]).map(|r| r.names))
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let Some((at, names)) = found else {
            return;
        };
        assert_eq!(
            at,
            PathBuf::from(format!("/proc/{pid}/root/tmp/perf-{pid}.map"))
        );
        assert!(!PathBuf::from(format!("/tmp/perf-{pid}.map")).exists());
        assert_eq!(names.unwrap()[&0x1004], "JS:inside /c.js:1:1");
    }

    #[test]
    fn a_process_on_this_root_is_named_from_tmp() {
        let me = std::process::id() as i32;
        assert_eq!(path(me), PathBuf::from(format!("/tmp/perf-{me}.map")));
    }

    #[test]
    fn ranges_outside_the_mappings_are_dropped() {
        let mut ranges = Ranges::default();
        ranges.insert(0x1000, 0x1100, "JS:~a /a.js:1:1");
        ranges.insert(0x2000, 0x2100, "JS:~b /b.js:1:1");
        ranges.insert(0x2f00, 0x3100, "JS:~c /c.js:1:1");
        ranges.insert(0x5000, 0x5100, "JS:~d /d.js:1:1");
        ranges.insert(0x9000, 0x9100, "JS:~e /e.js:1:1");
        // Mapped: 0x0800-0x1080 (a's first half), 0x3000-0x4000 (c's end),
        // 0x8000-0xa000 (all of e); b and d are gone.
        ranges.retain_mapped(&[(0x800, 0x1080), (0x3000, 0x4000), (0x8000, 0xa000)]);
        let left: Vec<u64> = ranges.by_start.keys().copied().collect();
        assert_eq!(left, [0x1000, 0x2f00, 0x9000]);
        assert_eq!(ranges.name_at(0x2f10).map(|n| &**n), Some("JS:c /c.js:1:1"));
        assert_eq!(ranges.names.len(), 3);
        ranges.retain_mapped(&[]);
        assert!(ranges.by_start.is_empty());
    }

    #[test]
    fn a_process_whose_code_comes_and_goes_is_followed_within_bounds() {
        // Code ranges at ever new addresses, as isolates of workers that
        // come and go write them; only this process's own mappings are
        // live. Far more ranges than are kept, yet the map is followed.
        let map = Scratch::new("churn");
        let me = std::process::id() as i32;
        let live = otel_thread_ctx_reader::maps::read(me).unwrap();
        let text_start = live.iter().find(|m| m.perms.contains('x')).unwrap().start;
        let mut f = Follower::at(map.0.clone());
        f.pid = me;
        let mut text = String::new();
        let dead = MAX_FOLLOWED_RANGES as u64 + 1000;
        for i in 0..dead {
            // Below every mapping of a process: never mapped.
            text.push_str(&format!(
                "{:x} 10 JS:~gone{} /w.js:1:1\n",
                0x1_0000 + i * 16,
                i % 100
            ));
        }
        text.push_str(&format!("{text_start:x} 10 JS:~alive /a.js:1:1\n"));
        map.append(text.as_bytes());
        let r = f.resolve(&[text_start + 4, 0x1_0004]).unwrap().names;
        assert!(!f.reads_whole_map());
        assert_eq!(r[&(text_start + 4)], "JS:alive /a.js:1:1");
        assert!(!r.contains_key(&0x1_0004));
        assert!(
            f.ranges.by_start.len() <= FIRST_PRUNE_AT + 1,
            "{}",
            f.ranges.by_start.len()
        );
    }

    #[test]
    fn no_map_is_an_error() {
        let mut f = Follower::at(std::env::temp_dir().join("perf-map-test-none.map"));
        assert!(f.resolve(&[1]).is_err());
    }

    #[test]
    fn too_long_lines_are_skipped_whole_even_while_written() {
        let map = Scratch::new("long");
        let mut f = Follower::at(map.0.clone());
        map.append(b"1000 10 JS:~before /a.js:1:1\n2000 10 JS:~");
        map.append(&vec![b'x'; MAX_LINE_BYTES]);
        assert_eq!(names_of(&mut f, &[0x1004]).len(), 1);
        map.append(&[b'y'; 100]);
        map.append(b" /b.js:1:1\n3000 10 JS:~after /c.js:1:1\n");
        let r = names_of(&mut f, &[0x1004, 0x2004, 0x3004]);
        assert!(!r.contains_key(&0x2004));
        assert_eq!(r[&0x3004], "JS:after /c.js:1:1");
        let streamed = resolve(
            std::fs::File::open(&map.0)
                .map(std::io::BufReader::new)
                .unwrap(),
            &[0x1004, 0x2004, 0x3004],
        )
        .unwrap()
        .names;
        assert_eq!(r, streamed);
    }

    #[test]
    fn a_map_past_the_bounds_is_read_whole_each_time() {
        let map = Scratch::new("bounds");
        let mut text = String::new();
        for i in 0..(MAX_FOLLOWED_RANGES as u64 + 10) {
            text.push_str(&format!(
                "{:x} 8 JS:~f{} /a.js:1:1\n",
                0x10000 + i * 16,
                i % 7
            ));
        }
        map.append(text.as_bytes());
        let mut f = Follower::at(map.0.clone());
        let addrs = [
            0x10004,
            0x10000 + 16 * (MAX_FOLLOWED_RANGES as u64 + 9) + 2,
            0x10009,
        ];
        let r = names_of(&mut f, &addrs);
        assert!(f.reads_whole_map());
        assert_eq!(r[&addrs[0]], "JS:f0 /a.js:1:1");
        assert_eq!(
            r[&addrs[1]],
            format!("JS:f{} /a.js:1:1", (MAX_FOLLOWED_RANGES + 9) % 7)
        );
        assert!(!r.contains_key(&addrs[2]));
        map.append(b"10000 8 JS:~later /b.js:1:1\n");
        assert_eq!(names_of(&mut f, &addrs)[&addrs[0]], "JS:later /b.js:1:1");
    }

    #[test]
    fn names_no_range_holds_are_forgotten() {
        let mut ranges = Ranges::default();
        // One code range written over again and again, each time by a new
        // function (eval'd code, new Function()).
        for i in 0..100_000 {
            ranges.insert(0x1000, 0x1100, &format!("JS:~f{i} /a.js:1:1"));
        }
        assert!(ranges.names.len() < 10_000, "{}", ranges.names.len());
        assert_eq!(ranges.by_start.len(), 1);
        assert_eq!(
            ranges.name_at(0x1010).map(|n| &**n),
            Some("JS:f99999 /a.js:1:1")
        );
        // Long names, together past the bound, of which one is held: not too large.
        let long = "x".repeat(MAX_LINE_BYTES / 2);
        for i in 0..(2 * MAX_FOLLOWED_NAME_BYTES / long.len()) {
            ranges.insert(0x1000, 0x1100, &format!("JS:~{long}{i}"));
            assert!(!ranges.too_large(), "after {i}");
        }
    }

    #[test]
    fn lines_that_are_not_utf8_or_entries_are_skipped_and_entries_past_a_code_object_ignored() {
        let mut map = b"1000 100 JS:~a /a.js:1:1\n".to_vec();
        map.extend_from_slice(b"1000 10 JS:~\xff\xfe /b.js:1:1\n");
        map.extend_from_slice(b"0 ffffffffffff Builtin:everything\r\n");
        map.extend_from_slice(b"1000 8 JS:~c /c.js:1:1");
        let r = resolve(&map[..], &[0x1004, 0x1010, 0x9000]).unwrap().names;
        assert_eq!(r[&0x1004], "JS:c /c.js:1:1");
        assert_eq!(r[&0x1010], "JS:a /a.js:1:1");
        assert!(!r.contains_key(&0x9000));
    }
}
