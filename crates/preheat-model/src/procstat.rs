//! The one parser of a process's or thread's stat line (`/proc/PID/stat`,
//! `/proc/PID/task/TID/stat`; see `proc(5)`): pure, over the text, so every crate that looks at
//! a process — the engine's readers, the run directory's liveness check — parses it the same way.

/// The fields of one `/proc/PID/stat` or `/proc/PID/task/TID/stat` line that the workspace
/// uses (see `proc(5)`; field numbers are 1-based over the whole line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidStat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 4: the parent's pid.
    pub ppid: u32,
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Field 14: user-mode CPU time, ticks (for a process: all its threads).
    pub utime: u64,
    /// Field 15: kernel-mode CPU time, ticks.
    pub stime: u64,
    /// Fields 16 and 17: user- and kernel-mode CPU time of its children that it waited for,
    /// ticks.
    pub cutime: u64,
    pub cstime: u64,
    /// Field 22: start time, ticks after boot.
    pub starttime: u64,
}

impl PidStat {
    /// Whether the process (thread) has exited and awaits its reaper.
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }

    /// CPU time, user + system, ticks.
    pub fn ticks(&self) -> u64 {
        self.utime + self.stime
    }

    /// CPU time with that of the children it waited for, ticks.
    pub fn ticks_with_children(&self) -> u64 {
        self.ticks() + self.cutime + self.cstime
    }
}

/// Parse a stat line: `pid (comm) state ppid pgrp ...`. The command name may hold spaces and
/// parentheses, so the fields are those after the **last** `)`. `None` if a field up to
/// `starttime` (field 22) is missing or not a number.
pub fn parse_pid_stat(text: &str) -> Option<PidStat> {
    let rest = text.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace();
    // The fields after ')' start at field 3 (state): field k is the (k − 3)th after `state`.
    let state = f.next()?.chars().next()?;
    let mut num = |skip: usize| -> Option<u64> { f.nth(skip)?.parse().ok() };
    let ppid = u32::try_from(num(0)?).ok()?;
    let pgrp = u32::try_from(num(0)?).ok()?;
    let utime = num(8)?; // fields 6..=13 skipped
    let stime = num(0)?;
    let cutime = num(0)?;
    let cstime = num(0)?;
    let starttime = num(4)?; // fields 18..=21 skipped
    Some(PidStat {
        state,
        ppid,
        pgrp,
        utime,
        stime,
        cutime,
        cstime,
        starttime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line in the kernel's layout, fields 1..=24 (the kernel writes 52).
    fn line(comm: &str, state: char) -> String {
        format!(
            "4321 ({comm}) {state} 4300 4299 4299 34816 4321 4194560 1375 0 0 0 \
             7 3 5 2 20 0 1 0 123456 10629120 847 18446744073709551615"
        )
    }

    #[test]
    fn pid_stat_comm_with_parentheses_and_spaces() {
        let s = parse_pid_stat(&line("a) (b c) (d", 'S')).unwrap();
        assert_eq!(
            s,
            PidStat {
                state: 'S',
                ppid: 4300,
                pgrp: 4299,
                utime: 7,
                stime: 3,
                cutime: 5,
                cstime: 2,
                starttime: 123_456,
            }
        );
        assert!(!s.is_zombie());
        assert_eq!(s.ticks(), 10);
        assert_eq!(s.ticks_with_children(), 17);
        // An empty name, and one that is only parentheses.
        assert_eq!(parse_pid_stat(&line("", 'R')).map(|s| s.ppid), Some(4300));
        assert_eq!(parse_pid_stat(&line(")(", 'R')).map(|s| s.pgrp), Some(4299));
    }

    #[test]
    fn pid_stat_zombie_and_garbage() {
        let z = parse_pid_stat(&line("worker", 'Z')).unwrap();
        assert!(z.is_zombie());
        assert_eq!(z.state, 'Z');
        assert!(!parse_pid_stat(&line("w", 'X')).unwrap().is_zombie());
        assert_eq!(parse_pid_stat(""), None);
        assert_eq!(parse_pid_stat("12 (no close paren R 1 1"), None);
        // Cut short before starttime; a non-numeric ppid.
        assert_eq!(
            parse_pid_stat("1 (a) R 0 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0"),
            None
        );
        assert_eq!(
            parse_pid_stat(&line("a", 'R').replace(" 4300 ", " x ")),
            None
        );
    }
}
