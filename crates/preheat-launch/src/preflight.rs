//! Pre-flight: whether the agent can be loaded into a program, decided before it is started, so
//! a program it cannot reach is refused at once with the reason and what to do, instead of
//! after the wait for an agent that never answers.
//!
//! The agent arrives by `LD_PRELOAD`, which only the dynamic linker reads, and only outside
//! secure execution. So the program that `execve` finally runs — after `#!` interpreters,
//! `/usr/bin/env NAME` included — must be an ELF program of the agent's class and machine with
//! an interpreter (`PT_INTERP`), run without a change of ids or a gain of file capabilities,
//! and no Go program (the Go runtime bypasses the C library the hooks are on, and takes the
//! faults of communication detection as its own; [`go`] knows a Go program even without its
//! build-id note).
//! [`check`] follows the program there and says which of these fails ([`Refusal`]), or what
//! it ruled out ([`Ready`]); [`diagnose`] asks the same of a started server's processes (a
//! wrapper may `exec` something else), for a wait that ended without an agent.
//!
//! What it cannot see: programs started later by the program, and security modules (SELinux,
//! AppArmor) that turn on secure execution by a domain transition.

use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use preheat_engine::elf::go::{self, GoBuild};
use preheat_engine::elf::{self, ElfError, ElfFile};
use preheat_engine::host;

/// Interpreters followed at most: the kernel's own limit of nested `#!` (`BINPRM_MAX_RECURSION`)
/// plus one `env` hop.
const MAX_HOPS: usize = 5;

/// What the agent must do in the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Be loaded (communication detection samples memory accesses; no hooks needed).
    Load,
    /// See requests through its hooks on the C library's calls (`accept`, `read`, `epoll_wait`,
    /// ...): a server to record or preheat.
    Hooks,
}

/// The agent can be loaded: the program finally run, and what was checked.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The ELF program that `execve` finally runs.
    pub program: PathBuf,
    /// What was ruled out, one clause each (said again if no agent answers later).
    pub ruled_out: Vec<String>,
}

/// The agent cannot be loaded into the program: why, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The program as given, and the file the reason is about when that is another one.
    pub program: String,
    pub reason: String,
    pub fix: String,
    /// Whether the server can be preheated from outside instead (`preheat-outside`): a program
    /// of the agent's class and machine whose requests its hooks cannot see — statically
    /// linked, or Go.
    pub outside: bool,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the agent cannot be loaded into {}: {}. What to do: {}",
            self.program, self.reason, self.fix
        )
    }
}

impl std::error::Error for Refusal {}

/// The interpreter and its optional argument on a `#!` line, as Linux reads them: the first line
/// of the file's first 256 bytes, the interpreter up to the first blank, the rest (trimmed) one
/// argument. `None` if `head` is no `#!` line or names no interpreter.
pub fn shebang(head: &[u8]) -> Option<(String, Option<String>)> {
    let rest = head.strip_prefix(b"#!")?;
    let rest = rest.get(..rest.len().min(254)).unwrap_or(rest);
    let line = rest.split(|c| *c == b'\n').next().unwrap_or(rest);
    let line = String::from_utf8_lossy(line);
    let line = line.trim_matches([' ', '\t', '\r']);
    let (interp, arg) = match line.split_once([' ', '\t']) {
        Some((i, a)) => (i, Some(a.trim_matches([' ', '\t', '\r']))),
        None => (line, None),
    };
    if interp.is_empty() {
        return None;
    }
    Some((
        interp.to_string(),
        arg.filter(|a| !a.is_empty()).map(str::to_string),
    ))
}

/// The program `env` runs, from the argument of a `#!/usr/bin/env ...` line: the first word
/// that is neither an option (nor an option's value) nor a `NAME=VALUE` setting; `-S` splits
/// the argument into words, as `env -S` does.
pub fn env_program(arg: &str) -> Option<String> {
    let mut words = arg.split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "-u" | "--unset" | "-C" | "--chdir" | "-P" => {
                words.next();
            }
            w if w.starts_with('-') => {}
            w if w.contains('=') => {}
            w => return Some(w.to_string()),
        }
    }
    None
}

fn refuse(program: &str, reason: impl Into<String>, fix: impl Into<String>) -> Refusal {
    Refusal {
        program: program.to_string(),
        reason: reason.into(),
        fix: fix.into(),
        outside: false,
    }
}

/// Where `execvp` finds `name`: itself when it has a slash, else on `PATH` (and the sbin
/// directories, [`host::find_program`]).
fn resolve(given: &str, name: &str) -> Result<PathBuf, Refusal> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    host::find_program(name).ok_or_else(|| {
        refuse(
            given,
            format!("no program `{name}` on PATH"),
            "give its path, or install it",
        )
    })
}

/// Whether `program` (a name on `PATH` or a path) can be started with the agent loaded into it
/// and doing what it `needs` there, following `#!` interpreters; `agent` is the agent's
/// library, whose class and machine the program must share.
pub fn check(program: &str, agent: &Path, needs: Needs) -> Result<Ready, Refusal> {
    let mut path = resolve(program, program)?;
    let mut via: Vec<String> = Vec::new();
    for _ in 0..MAX_HOPS {
        let meta = std::fs::metadata(&path).map_err(|e| {
            refuse(
                program,
                format!("{} cannot be read ({e})", path.display()),
                "give the path of an existing program",
            )
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(refuse(
                program,
                format!("{} is not an executable file", path.display()),
                format!("make it executable (chmod +x {})", path.display()),
            ));
        }
        let head = read_head(&path).map_err(|e| {
            refuse(
                program,
                format!("{} cannot be read ({e})", path.display()),
                "run preheat as a user who may read it",
            )
        })?;
        if !head.starts_with(b"#!") {
            let mut ready = check_elf(program, &path, agent, needs)?;
            if !via.is_empty() {
                ready.ruled_out.insert(
                    0,
                    format!("{} runs {}", via.join(", which runs "), path.display()),
                );
            }
            return Ok(ready);
        }
        let Some((interp, arg)) = shebang(&head) else {
            return Err(refuse(
                program,
                format!("the #! line of {} names no interpreter", path.display()),
                "name the interpreter on its first line (e.g. #!/bin/sh)",
            ));
        };
        via.push(format!("{} (a #! script)", path.display()));
        path = if Path::new(&interp).file_name().is_some_and(|n| n == "env") {
            let Some(name) = arg.as_deref().and_then(env_program) else {
                return Err(refuse(
                    program,
                    format!("the #!{interp} line of {} names no program", path.display()),
                    "name the interpreter after env",
                ));
            };
            resolve(program, &name)?
        } else {
            PathBuf::from(interp)
        };
    }
    Err(refuse(
        program,
        format!("more than {MAX_HOPS} levels of #! interpreters"),
        "start the final interpreter directly",
    ))
}

/// The first 256 bytes of a file (what the kernel reads to choose how to run it).
fn read_head(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(256);
    std::fs::File::open(p)?.take(256).read_to_end(&mut head)?;
    Ok(head)
}

/// The checks on the ELF program `path` that `execve` finally runs (`program` is what was
/// given, for the messages).
pub fn check_elf(program: &str, path: &Path, agent: &Path, needs: Needs) -> Result<Ready, Refusal> {
    let shown = path.display();
    let f = read_program(program, path)?;
    let mut ruled_out = Vec::new();
    if let Ok(a) = elf::read(agent) {
        let what = |h: &elf::Header| {
            let bits = match h.class {
                elf::Class::Elf32 => 32,
                elf::Class::Elf64 => 64,
            };
            format!("{bits}-bit {}", elf::machine_name(h.machine))
        };
        let (p, q) = (what(&f.header), what(&a.header));
        if (f.header.class, f.header.machine) != (a.header.class, a.header.machine) {
            return Err(refuse(
                program,
                format!(
                    "{shown} is a {p} program and the agent a {q} library: the dynamic linker \
                     skips a preloaded library of another class or machine"
                ),
                format!("build the server as a {q} program"),
            ));
        }
        ruled_out.push(format!("it is a {p} program like the agent"));
    }
    if let Some(g) = go::build(path, &f) {
        return Err(go_refusal(program, path, &f, &g, needs));
    }
    ruled_out.push(
        "it is no Go program (the agent's hooks and communication detection do not work in \
         one)"
            .into(),
    );
    let Some(interp) = &f.interp else {
        return Err(static_refusal(program, path, &f));
    };
    if !Path::new(interp).exists() {
        return Err(refuse(
            program,
            format!("{shown} needs the dynamic linker {interp}, which is not installed here"),
            "build it for this system (or install that C library)",
        ));
    }
    ruled_out.insert(
        0,
        format!("{shown} is dynamically linked (its dynamic linker: {interp})"),
    );
    if let Some(reason) = secure_execution(path) {
        return Err(refuse(
            program,
            format!(
                "{shown} is {reason}: the kernel runs it in secure-execution mode (AT_SECURE), \
                 where the dynamic linker ignores an LD_PRELOAD path"
            ),
            "run a copy without them (a plain cp drops set-id bits and file capabilities), \
             or run preheat as the user and group the program runs as",
        ));
    }
    ruled_out.push(
        "no set-uid/set-gid bit or file capability turns on secure execution (in which the \
         dynamic linker ignores LD_PRELOAD)"
            .into(),
    );
    Ok(Ready {
        program: path.to_path_buf(),
        ruled_out,
    })
}

/// `path` as an ELF program (an executable or a position-independent one), or why it is none.
fn read_program(program: &str, path: &Path) -> Result<ElfFile, Refusal> {
    let shown = path.display();
    let f = match elf::read(path) {
        Ok(f) => f,
        Err(ElfError::NotElf) => {
            return Err(refuse(
                program,
                format!(
                    "{shown} is neither an ELF program nor a #! script, so the kernel cannot \
                     run it"
                ),
                "give the program itself, or start a script with a #! line",
            ))
        }
        Err(e) => {
            return Err(refuse(
                program,
                format!("{shown} is {e}"),
                "give a program this machine can run",
            ))
        }
    };
    if !matches!(f.header.kind, elf::ET_EXEC | elf::ET_DYN) {
        return Err(refuse(
            program,
            format!(
                "{shown} is an ELF file of type {}, not a program",
                f.header.kind
            ),
            "give a linked program",
        ));
    }
    Ok(f)
}

/// Why the agent's hooks see nothing in a Go program.
const GO_NO_HOOKS: &str = "the Go runtime makes its system calls itself, not through the C \
                           library whose calls the agent hooks";

/// Why communication detection fails in a Go program (measured with go1.26.8, 5 runs each
/// under `preheat comm`: a `net/http` server crashed in 5, a position-independent loop in 5, a
/// plain loop in 1).
const GO_NO_COMM: &str = "communication detection revokes access to sampled pages and catches \
                          the faults, which in a Go program reach the Go runtime's own handler \
                          as fatal (measured: 11 of 15 runs of three Go programs crashed or \
                          ended without a report)";

/// " (go1.22.5, built with CGO_ENABLED=0)": what its build information says, if anything.
fn go_detail(g: &GoBuild) -> String {
    let d = g.describe();
    if d.is_empty() {
        d
    } else {
        format!(" ({d})")
    }
}

/// Why the agent cannot do what it `needs` in the Go program `path`, statically linked or not,
/// and what to do instead. Rebuilding a static one dynamically linked lets the agent load, but
/// helps neither need, so the message says so rather than send the user to rebuild.
fn go_refusal(program: &str, path: &Path, f: &ElfFile, g: &GoBuild, needs: Needs) -> Refusal {
    let linked = match (&f.interp, f.has_dynamic()) {
        (Some(_), _) => "",
        (None, false) => "statically linked ",
        (None, true) => "statically linked (static-pie) ",
    };
    let load = if f.interp.is_some() {
        "the agent would load"
    } else {
        "it has no dynamic linker, and only the dynamic linker reads LD_PRELOAD; rebuilt \
         dynamically linked (CGO_ENABLED=1 go build -ldflags=-linkmode=external) it would take \
         the agent"
    };
    let (why, fix) = match needs {
        Needs::Hooks => (
            format!("but its hooks would see no request: {GO_NO_HOOKS}"),
            "see a Go server's requests from outside, without the agent: preheat observe \
             --pid PID --port PORT (as root; static programs too)",
        ),
        Needs::Load => (
            format!("but {GO_NO_COMM}"),
            "none with the agent yet (it would have to keep its fault handler ahead of the Go \
             runtime's); detect communication in programs of other runtimes (C, C++, Rust, the \
             JVM)",
        ),
    };
    Refusal {
        outside: true,
        ..refuse(
            program,
            format!(
                "{} is a {linked}Go program{}: {load}, {why}",
                path.display(),
                go_detail(g)
            ),
            fix,
        )
    }
}

fn static_refusal(program: &str, path: &Path, f: &ElfFile) -> Refusal {
    let pie = if f.has_dynamic() { " (static-pie)" } else { "" };
    Refusal {
        outside: true,
        ..refuse(
            program,
            format!(
                "{} is statically linked{pie}: it has no dynamic linker, and only the dynamic \
                 linker reads LD_PRELOAD",
                path.display()
            ),
            "link it dynamically: C/C++ without -static, Rust for a -gnu target without \
             +crt-static",
        )
    }
}

/// Why running `path` would turn on secure execution ([`secure_reason`] for this process and
/// the file's mode, owner and capabilities); `None` if it would not, or cannot be told.
fn secure_execution(path: &Path) -> Option<String> {
    let me = host::Creds::current().ok()?;
    let meta = std::fs::metadata(path).ok()?;
    let file = ExecFile {
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        caps: host::has_file_caps(path).unwrap_or(false),
        nosuid: host::on_nosuid_mount(path).unwrap_or(false),
    };
    secure_reason(&me, &file)
}

/// What the kernel weighs about a file it executes for secure execution.
#[derive(Debug, Clone, Copy)]
pub struct ExecFile {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// It has file capabilities.
    pub caps: bool,
    /// It is on a `nosuid` mount.
    pub nosuid: bool,
}

/// Why executing `file` as `me` turns on secure execution, by the kernel's rule
/// (`cap_bprm_creds_from_file`): the effective uid after the exec differs from the real uid,
/// or the effective gid from the real gid, or a non-root user gains file capabilities. Set-id
/// bits and capabilities count only outside `no_new_privs` and `nosuid` mounts. `None`: it
/// does not.
pub fn secure_reason(me: &host::Creds, file: &ExecFile) -> Option<String> {
    let honoured = !me.no_new_privs && !file.nosuid;
    let setuid = honoured && file.mode & 0o4000 != 0;
    // A set-gid bit without group execute marks mandatory locking, not a set-gid program.
    let setgid = honoured && file.mode & 0o2000 != 0 && file.mode & 0o010 != 0;
    let euid = if setuid { file.uid } else { me.euid };
    let egid = if setgid { file.gid } else { me.egid };
    if euid != me.ruid {
        return Some(if setuid {
            format!(
                "set-uid to uid {euid} while preheat runs as uid {}",
                me.ruid
            )
        } else {
            format!("run with effective uid {euid} and real uid {}", me.ruid)
        });
    }
    if egid != me.rgid {
        return Some(if setgid {
            format!(
                "set-gid to gid {egid} while preheat runs as gid {}",
                me.rgid
            )
        } else {
            format!("run with effective gid {egid} and real gid {}", me.rgid)
        });
    }
    if honoured && me.ruid != 0 && file.caps {
        return Some(format!(
            "given file capabilities (security.capability) while preheat runs as uid {}, not root",
            me.ruid
        ));
    }
    None
}

/// For a server whose processes `pids` have no agent that answers: what each process is and
/// why it has no agent, as far as can be seen (one line each, at most 8).
pub fn diagnose(pids: &[u32], agent: &Path) -> Vec<String> {
    let agent_name = agent.canonicalize().unwrap_or_else(|_| agent.to_path_buf());
    pids.iter()
        .take(8)
        .filter_map(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            let shown = exe.display();
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            let loaded = maps
                .lines()
                .any(|l| l.ends_with(&*agent_name.to_string_lossy()));
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let preload = environ
                .split(|c| *c == 0)
                .any(|v| v.starts_with(b"LD_PRELOAD="));
            Some(if loaded {
                format!(
                    "pid {pid} ({shown}): the agent is loaded but did not answer (see its log in \
                     the run directory; PREHEAT_AGENT_ONLY or PREHEAT_AGENT_DISABLE may have \
                     turned it off)"
                )
            } else {
                match check_elf(&format!("pid {pid}"), &exe, agent, Needs::Hooks) {
                    Err(r) => format!("pid {pid}: {}. What to do: {}", r.reason, r.fix),
                    Ok(_) if !preload => format!(
                        "pid {pid} ({shown}): no LD_PRELOAD in its environment (whoever started \
                         it removed it)"
                    ),
                    Ok(_) => format!(
                        "pid {pid} ({shown}): could load the agent and has LD_PRELOAD, but the \
                         agent is not loaded"
                    ),
                }
            })
        })
        .collect()
}

/// Whether any of `pids` has the agent loaded, or might still load it (is one the pre-flight
/// cannot refuse): `false` only when every process is one the agent cannot reach.
pub fn any_reachable(pids: &[u32], agent: &Path) -> bool {
    pids.iter().any(|pid| {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|exe| check_elf("", &exe, agent, Needs::Hooks).is_ok())
            .unwrap_or(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebang_lines_as_the_kernel_reads_them() {
        let sb = |s: &str| shebang(s.as_bytes());
        assert_eq!(sb("#!/bin/sh\necho"), Some(("/bin/sh".into(), None)));
        assert_eq!(
            sb("#! /usr/bin/python3  -u -X dev \r\nx"),
            Some(("/usr/bin/python3".into(), Some("-u -X dev".into())))
        );
        assert_eq!(sb("#!\t/bin/sh\t\n"), Some(("/bin/sh".into(), None)));
        assert_eq!(sb("#!"), None);
        assert_eq!(sb("#!   \n/bin/sh"), None);
        assert_eq!(sb("echo hi"), None);
        assert_eq!(
            shebang(b"#!/bin/\xff\xfe"),
            Some(("/bin/\u{fffd}\u{fffd}".into(), None))
        );
        // A line longer than the kernel's buffer is cut, never a panic.
        let long = format!("#!/{}", "x".repeat(1000));
        assert_eq!(shebang(long.as_bytes()).unwrap().0.len(), 254);
    }

    #[test]
    fn env_lines_name_the_program_after_options_and_settings() {
        assert_eq!(env_program("python3"), Some("python3".into()));
        assert_eq!(env_program("-S python3 -u"), Some("python3".into()));
        assert_eq!(env_program("-S A=1 -u B node app.js"), Some("node".into()));
        assert_eq!(env_program("-i --chdir /tmp ./srv"), Some("./srv".into()));
        assert_eq!(env_program("-S"), None);
        assert_eq!(env_program(""), None);
    }

    fn creds(ruid: u32, euid: u32, rgid: u32, egid: u32) -> host::Creds {
        host::Creds {
            ruid,
            euid,
            rgid,
            egid,
            no_new_privs: false,
        }
    }

    fn file(mode: u32, uid: u32, gid: u32, caps: bool) -> ExecFile {
        ExecFile {
            mode,
            uid,
            gid,
            caps,
            nosuid: false,
        }
    }

    #[test]
    fn secure_execution_by_the_kernels_rule() {
        let root = creds(0, 0, 0, 0);
        let user = creds(1000, 1000, 1000, 1000);
        // Root: a set-uid root program or capabilities change nothing; another owner does.
        assert_eq!(secure_reason(&root, &file(0o4755, 0, 0, true)), None);
        assert!(secure_reason(&root, &file(0o4755, 65534, 0, false))
            .is_some_and(|r| r.contains("set-uid to uid 65534")));
        assert!(secure_reason(&root, &file(0o2755, 0, 65534, false))
            .is_some_and(|r| r.contains("set-gid to gid 65534")));
        // Set-gid without group execute is mandatory locking, not set-gid.
        assert_eq!(secure_reason(&root, &file(0o2745, 0, 65534, false)), None);
        // A user: set-uid to itself is nothing, to root is secure; capabilities are.
        assert_eq!(secure_reason(&user, &file(0o4755, 1000, 1000, false)), None);
        assert!(secure_reason(&user, &file(0o4755, 0, 0, false)).is_some());
        assert!(secure_reason(&user, &file(0o755, 0, 0, true))
            .is_some_and(|r| r.contains("capabilities")));
        // no_new_privs and nosuid mounts ignore bits and capabilities.
        let nnp = host::Creds {
            no_new_privs: true,
            ..user
        };
        assert_eq!(secure_reason(&nnp, &file(0o6755, 0, 0, true)), None);
        let on_nosuid = ExecFile {
            nosuid: true,
            ..file(0o6755, 0, 0, true)
        };
        assert_eq!(secure_reason(&user, &on_nosuid), None);
        // Already running with another effective id.
        assert!(secure_reason(&creds(1000, 0, 1000, 1000), &file(0o755, 0, 0, false)).is_some());
    }
}
