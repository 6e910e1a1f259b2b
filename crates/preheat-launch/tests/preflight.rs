//! The pre-flight against what really happens (issue 23, point 4). Each program is checked, then
//! really run with a probe library in `LD_PRELOAD` whose constructor leaves a mark: the verdict
//! must match the mark. Static, static-pie and dynamic programs built here, `#!` scripts to each
//! (through `env` too), set-uid/set-gid copies, file capabilities, files that are no program;
//! then `launch::start` on a wrapper that runs a static server, and on a server whose agent
//! never comes (the timeout's account of what was ruled out).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use preheat_launch::launch::{self, ServerSpec};
use preheat_launch::preflight::{self, Needs, Refusal};
use preheat_testsupport::{free_port, skip, try_compile_c, ACCEPT_CLOSE_SERVER_C};

const PROBE_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
/* One line per process it is loaded into: that process's program. */
__attribute__((constructor)) static void mark(void) {
    const char *m = getenv("PREFLIGHT_MARK");
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (!m || n < 0) return;
    exe[n] = 0;
    FILE *f = fopen(m, "a");
    if (f) { fprintf(f, "%s\n", exe); fclose(f); }
}
"#;

const PROG_C: &str = "int main(void) { return 0; }\n";

struct Built {
    dir: tempfile::TempDir,
    probe: PathBuf,
    dynamic: PathBuf,
    /// `None`: no static C library here (the skip is reported).
    static_: Option<PathBuf>,
    /// The program a run is expected to end in (canonical path).
    last: std::cell::RefCell<String>,
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// Compile `src` with `flags`; `None` when it cannot be built here (no compiler: skipped as
/// `gcc`; a failing static link: skipped as `libc6-dev`, which ships `libc.a`).
fn cc(dir: &Path, src: &str, out: &str, flags: &[&str]) -> Option<PathBuf> {
    let c = write(dir, &format!("{out}.c"), src, 0o644);
    match try_compile_c(&c, &dir.join(out), flags)? {
        Ok(p) => Some(p),
        Err(e) if flags.iter().any(|f| f.starts_with("-static")) => {
            skip("libc6-dev", &format!("cannot link {flags:?} here: {e}"));
            None
        }
        Err(e) => panic!("compiling {out}: {e}"),
    }
}

fn build() -> Option<Built> {
    let dir = tempfile::Builder::new()
        .prefix("preheat-preflight-")
        .tempdir()
        .unwrap();
    // Others (nobody, for the capability case) may run its programs and leave the mark.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = cc(dir.path(), PROBE_C, "probe.so", &["-shared", "-fPIC"])?;
    let dynamic = cc(dir.path(), PROG_C, "dynamic", &[])?;
    let static_ = cc(dir.path(), PROG_C, "static", &["-static"]);
    Some(Built {
        dir,
        probe,
        dynamic,
        static_,
        last: Default::default(),
    })
}

impl Built {
    /// Run `argv` with the probe preloaded (through `wrap`, e.g. `setpriv ...`): whether it was
    /// loaded into the program that runs last (a wrapper or `env` that loads it and then runs
    /// another program does not count), or the spawn's error.
    fn loads_via(&self, wrap: &[&str], argv: &[&str]) -> Result<bool, std::io::Error> {
        let mark = self.dir.path().join("mark");
        // Empty, and writable by every user a run switches to.
        std::fs::write(&mark, "").unwrap();
        std::fs::set_permissions(&mark, std::fs::Permissions::from_mode(0o666)).unwrap();
        let all: Vec<&str> = wrap.iter().chain(argv).copied().collect();
        let st = Command::new(all[0])
            .args(&all[1..])
            .env("LD_PRELOAD", &self.probe)
            .env("PREFLIGHT_MARK", &mark)
            .status()?;
        assert!(st.success(), "{all:?}: {st}");
        let marks = std::fs::read_to_string(&mark).unwrap_or_default();
        Ok(marks.lines().last() == Some(self.last.borrow().as_str()))
    }

    /// Whether the probe is loaded into `last` when `program` runs.
    fn loads_into(&self, program: &Path, last: &Path) -> Result<bool, std::io::Error> {
        *self.last.borrow_mut() = std::fs::canonicalize(last).unwrap().display().to_string();
        self.loads_via(&[], &[program.to_str().unwrap()])
    }

    fn loads(&self, program: &Path) -> Result<bool, std::io::Error> {
        self.loads_into(program, program)
    }

    fn check(&self, program: &Path) -> Result<preflight::Ready, Refusal> {
        preflight::check(program.to_str().unwrap(), &self.probe, Needs::Hooks)
    }

    /// The refusal of `program` where the agent `needs` only to load (communication detection).
    fn refused_to_load(&self, program: &Path) -> String {
        preflight::check(program.to_str().unwrap(), &self.probe, Needs::Load)
            .unwrap_err()
            .to_string()
    }

    /// The pre-flight's verdict on `program`, which runs `last` in the end, agrees with a real
    /// run, and it is `expect_ok`; a refusal names `word`. Returns the refusal's text.
    fn agrees(&self, program: &Path, expect_ok: bool, word: &str) -> String {
        self.agrees_via(program, program, expect_ok, word)
    }

    fn agrees_via(&self, program: &Path, last: &Path, expect_ok: bool, word: &str) -> String {
        let verdict = self.check(program);
        if let Ok(r) = &verdict {
            assert_eq!(
                r.program.canonicalize().unwrap(),
                last.canonicalize().unwrap()
            );
        }
        let real = self.loads_into(program, last).unwrap();
        assert_eq!(
            verdict.is_ok(),
            real,
            "{}: pre-flight {verdict:?}, loaded for real: {real}",
            program.display()
        );
        assert_eq!(real, expect_ok, "{}", program.display());
        match verdict {
            Ok(r) => r.ruled_out.join("; "),
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains(word), "{text}");
                text
            }
        }
    }
}

#[test]
fn verdicts_match_real_runs_for_static_dynamic_and_scripts() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let dynamic = b.dynamic.display().to_string();
    let text = b.agrees(&b.dynamic, true, "");
    assert!(text.contains("dynamically linked") && text.contains("secure execution"));
    let script = write(d, "dyn.sh", &format!("#!{dynamic}\n"), 0o755);
    let text = b.agrees_via(&script, &b.dynamic, true, "");
    assert!(
        text.contains("a #! script") && text.contains("runs"),
        "{text}"
    );
    if Path::new("/usr/bin/env").exists() {
        let via_env = write(d, "env-sh", "#!/usr/bin/env sh\nexit 0\n", 0o755);
        let sh = preheat_testsupport::find_program("sh").unwrap();
        b.agrees_via(&via_env, &sh, true, "");
    }
    let Some(stat) = &b.static_ else { return };
    let stat = stat.display().to_string();
    let text = b.agrees(Path::new(&stat), false, "statically linked");
    assert!(text.contains("without -static"), "says what to do: {text}");
    // The demo preheats it from outside instead; a dynamic program is never refused.
    assert!(b.check(Path::new(&stat)).unwrap_err().outside);
    let stat_p = Path::new(&stat);
    let script = write(d, "static.sh", &format!("#!{stat}\n"), 0o755);
    b.agrees_via(&script, stat_p, false, "statically linked");
    if Path::new("/usr/bin/env").exists() {
        // env itself loads the probe, then runs the static program without it.
        let via_env = write(
            d,
            "env-static",
            &format!("#!/usr/bin/env -S {stat}\n"),
            0o755,
        );
        b.agrees_via(&via_env, stat_p, false, "statically linked");
    }
    if let Some(pie) = cc(d, PROG_C, "static-pie", &["-static-pie"]) {
        b.agrees(&pie, false, "static-pie");
    }
}

#[test]
fn set_id_copies_and_capabilities_as_the_kernel_treats_them() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let copy = |name: &str, mode: u32, owner: Option<(u32, u32)>| {
        let p = d.join(name);
        std::fs::copy(&b.dynamic, &p).unwrap();
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(&p, Some(u), Some(g)).unwrap();
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    // Set-uid to ourselves: no change of ids, so the agent loads (root's usual case).
    b.agrees(&copy("setuid-self", 0o4755, None), true, "");
    let me = preheat_engine::host::Creds::current().unwrap();
    if me.ruid != 0 {
        skip("root", "chown to another user and setcap need root");
        return;
    }
    // Set-uid or set-gid to another user or group: secure execution, even for root.
    let text = b.agrees(
        &copy("setuid-nobody", 0o4755, Some((65534, 0))),
        false,
        "set-uid to uid 65534",
    );
    assert!(
        text.contains("secure-execution") && text.contains("cp"),
        "{text}"
    );
    b.agrees(
        &copy("setgid-nogroup", 0o2755, Some((0, 65534))),
        false,
        "set-gid to gid 65534",
    );
    // File capabilities: nothing for root; secure execution for another user.
    let (Some(setcap), Some(setpriv)) = (
        preheat_testsupport::find_program("setcap"),
        preheat_testsupport::find_program("setpriv"),
    ) else {
        skip(
            "setcap",
            "setcap or setpriv is not installed (libcap2-bin, util-linux)",
        );
        return;
    };
    let capped = copy("capped", 0o755, None);
    let st = Command::new(setcap)
        .args(["cap_net_bind_service+ep"])
        .arg(&capped)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(preheat_engine::host::has_file_caps(&capped).unwrap());
    b.agrees(&capped, true, "");
    let as_nobody = [
        setpriv.to_str().unwrap(),
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    // setpriv loads the probe too: what counts is the program it runs.
    *b.last.borrow_mut() = capped.display().to_string();
    assert!(!b
        .loads_via(&as_nobody, &[capped.to_str().unwrap()])
        .unwrap());
    *b.last.borrow_mut() = b.dynamic.display().to_string();
    assert!(b
        .loads_via(&as_nobody, &[b.dynamic.to_str().unwrap()])
        .unwrap());
    let nobody = preheat_engine::host::Creds {
        ruid: 65534,
        euid: 65534,
        rgid: 65534,
        egid: 65534,
        no_new_privs: false,
    };
    let file = preflight::ExecFile {
        mode: 0o755,
        uid: 0,
        gid: 0,
        caps: true,
        nosuid: false,
    };
    assert!(preflight::secure_reason(&nobody, &file).is_some());
}

#[test]
fn files_that_are_no_program_are_refused_and_really_fail() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let refused = |p: &Path, word: &str| {
        let r = b.check(p).unwrap_err();
        // No program the outside agent could stand in for either.
        assert!(!r.outside, "{}: {r}", p.display());
        let e = r.to_string();
        assert!(e.contains(word), "{}: {e}", p.display());
        assert!(b.loads(p).is_err(), "{} cannot be started", p.display());
    };
    refused(
        &write(d, "text", "echo no shebang\n", 0o755),
        "neither an ELF program nor a #! script",
    );
    let bytes = std::fs::read(&b.dynamic).unwrap();
    let trunc = d.join("truncated");
    std::fs::write(&trunc, &bytes[..100]).unwrap();
    std::fs::set_permissions(&trunc, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(&trunc, "truncated");
    // The same program with a dynamic linker that does not exist.
    let interp = preheat_engine::elf::read(&b.dynamic)
        .unwrap()
        .interp
        .unwrap();
    let at = bytes
        .windows(interp.len())
        .position(|w| w == interp.as_bytes())
        .unwrap();
    let mut moved = bytes.clone();
    moved[at + interp.len() - 1] = b'Q';
    let elsewhere = d.join("other-libc");
    std::fs::write(&elsewhere, &moved).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(&elsewhere, "not installed here");
    // A 32-bit header (i386): another class than the agent's.
    let mut h = vec![0u8; 52 + 32];
    h[..6].copy_from_slice(b"\x7fELF\x01\x01");
    h[16] = 2; // ET_EXEC
    h[18] = 3; // EM_386
    h[28] = 52; // e_phoff
    h[42] = 32; // e_phentsize
    h[44] = 1; // e_phnum
    let i386 = d.join("i386");
    std::fs::write(&i386, &h).unwrap();
    std::fs::set_permissions(&i386, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = b.check(&i386).unwrap_err().to_string();
    assert!(e.contains("32-bit i386") && e.contains("64-bit"), "{e}");
    // A dynamically linked Go program (crafted: its interpreter, a Go build-id note): the agent
    // would load, but its hooks would see no request, nor detection work.
    let go = crafted_go(&interp);
    let path = d.join("go-server");
    std::fs::write(&path, &go).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = b.check(&path).unwrap_err().to_string();
    assert!(
        e.contains("is a Go program") && e.contains("C library"),
        "{e}"
    );
    let e = b.refused_to_load(&path);
    assert!(e.contains("communication detection"), "{e}");
    // Not executable, not there.
    let plain = write(d, "plain", PROG_C, 0o644);
    assert!(b
        .check(&plain)
        .unwrap_err()
        .to_string()
        .contains("chmod +x"));
    let e = preflight::check("preheat-no-such-program", &b.probe, Needs::Load).unwrap_err();
    assert!(e
        .to_string()
        .contains("no program `preheat-no-such-program` on PATH"));
    let e = b.check(&d.join("missing")).unwrap_err().to_string();
    assert!(e.contains("cannot be read"), "{e}");
    // A #! line without interpreter, and a loop of scripts.
    refused(
        &write(d, "empty-shebang", "#!\n", 0o755),
        "names no interpreter",
    );
    let a = d.join("loop-a");
    write(
        d,
        "loop-a",
        &format!("#!{}\n", d.join("loop-b").display()),
        0o755,
    );
    write(d, "loop-b", &format!("#!{}\n", a.display()), 0o755);
    refused(&a, "levels of #! interpreters");
}

/// A Go program that does nothing.
const GO_PROG: &str = "package main\n\nfunc main() {}\n";

#[test]
fn real_go_programs_static_bare_and_dynamic() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let go = |name: &str, env: &[(&str, &str)], flags: &[&str]| {
        let out = d.join(name);
        match preheat_testsupport::try_go_build(GO_PROG, &out, env, flags)? {
            Ok(p) => Some(p),
            Err(e) => panic!("go build of {name}: {e}"),
        }
    };
    // CGO_ENABLED=0, Go's default for many deployments: static, and said to be Go.
    let Some(stat) = go("go-static", &[("CGO_ENABLED", "0")], &[]) else {
        return;
    };
    let text = b.agrees(&stat, false, "is a statically linked Go program (go1.");
    assert!(text.contains("built with CGO_ENABLED=0"), "{text}");
    assert!(
        text.contains("preheat observe --pid") && text.contains("-linkmode=external"),
        "says what to do: {text}"
    );
    // Nor for preheat comm: rebuilt, the agent would load, but detection fails in Go.
    let e = b.refused_to_load(&stat);
    assert!(
        e.contains("communication detection") && e.contains("What to do: none with the agent"),
        "{e}"
    );
    // A reproducible build (no build-id note, no symbols) is known by its build information.
    let bare = go(
        "go-bare",
        &[("CGO_ENABLED", "0")],
        &["-trimpath", "-ldflags=-s -w -buildid="],
    )
    .unwrap();
    assert!(
        !preheat_engine::elf::read(&bare).unwrap().is_go(),
        "no Go build-id note"
    );
    b.agrees(&bare, false, "statically linked Go program");
    // Dynamically linked (cgo, the C linker; no build-id note either): the agent loads, as
    // the message says, but neither its hooks nor communication detection would work.
    let dynamic = go(
        "go-dynamic",
        &[("CGO_ENABLED", "1")],
        &["-ldflags=-linkmode=external -buildid="],
    )
    .unwrap();
    assert!(b.loads(&dynamic).unwrap(), "the probe loads into it");
    // Any Go program can be preheated from outside instead (the demo's default).
    for p in [&stat, &bare, &dynamic] {
        assert!(b.check(p).unwrap_err().outside, "{}", p.display());
    }
    let e = b.check(&dynamic).unwrap_err().to_string();
    assert!(
        e.contains("is a Go program (go1.")
            && e.contains("CGO_ENABLED=1): the agent would load, but its hooks would see no")
            && e.contains("preheat observe --pid"),
        "{e}"
    );
    let e = b.refused_to_load(&dynamic);
    assert!(e.contains("communication detection"), "{e}");
}

/// A 64-bit x86-64 ELF header with an interpreter `interp` and a Go build-id note.
fn crafted_go(interp: &str) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    b[16] = 3; // ET_DYN
    b[18] = 62; // EM_X86_64
    b[32] = 64; // e_phoff
    b[54] = 56; // e_phentsize
    b[56] = 2; // e_phnum
    let data = 64 + 2 * 56;
    // As the Go linker writes it: the owner's size 4 ("Go" and two NULs), 2 bytes of id.
    let mut note = Vec::new();
    for v in [4u32, 2, 4] {
        note.extend(v.to_le_bytes());
    }
    note.extend(b"Go\0\0id\0\0");
    let path = format!("{interp}\0");
    for (kind, off, len) in [(3u32, data, path.len()), (4, data + path.len(), note.len())] {
        let mut e = [0u8; 56];
        e[..4].copy_from_slice(&kind.to_le_bytes());
        e[8..16].copy_from_slice(&(off as u64).to_le_bytes());
        e[32..40].copy_from_slice(&(len as u64).to_le_bytes());
        e[48..56].copy_from_slice(&4u64.to_le_bytes());
        b.extend(e);
    }
    b.extend(path.as_bytes());
    b.extend(note);
    b
}

/// A server started with the agent; the error of `launch::start` and how long it took. Nothing
/// is left listening on its port afterwards.
fn start_fails(argv: Vec<String>, port: u16, timeout: Duration) -> (String, Duration) {
    let tmp = tempfile::Builder::new()
        .prefix("preheat-preflight-run-")
        .tempdir()
        .unwrap();
    let spec = ServerSpec {
        name: "preflight".into(),
        argv,
        port,
        agent: true,
        cpus: vec![],
        env: vec![],
        agent_only: None,
        netns: None,
    };
    let t0 = Instant::now();
    let err = match launch::start(spec, &tmp.path().join("run"), tmp.path(), timeout) {
        Ok(_) => panic!("the server started with an agent"),
        Err(e) => format!("{e:#}"),
    };
    let took = t0.elapsed();
    assert!(!launch::port_in_use(port), "the server was stopped");
    (err, took)
}

#[test]
fn start_refuses_at_once_what_cannot_have_the_agent() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let Some(server) = cc(d, ACCEPT_CLOSE_SERVER_C, "server-static", &["-static"]) else {
        return;
    };
    let s = server.display().to_string();
    // Given directly: refused before it starts.
    let port = free_port();
    let (err, took) = start_fails(
        vec![s.clone(), port.to_string()],
        port,
        Duration::from_secs(20),
    );
    assert!(err.contains("statically linked"), "{err}");
    // "At once" against the 20 s wait it replaces; the bound leaves room for a loaded machine
    // (tests run in parallel on 2 CPUs: 1 s was exceeded once beside other tests).
    assert!(took < Duration::from_secs(5), "refused in {took:?}");
    // Through a dynamic wrapper that execs it: refused as soon as it listens.
    let port = free_port();
    let wrapper = vec!["sh".into(), "-c".into(), format!("exec {s} {port}")];
    let (err, took) = start_fails(wrapper, port, Duration::from_secs(20));
    assert!(
        err.contains("none of its processes can have the agent")
            && err.contains("statically linked"),
        "{err}"
    );
    assert!(err.contains("ruled out before the start"), "{err}");
    assert!(took < Duration::from_secs(5), "refused in {took:?}");
}

#[test]
fn a_wait_that_ends_without_agent_says_what_was_ruled_out() {
    let Some(b) = build() else { return };
    let d = b.dir.path();
    let server = cc(d, ACCEPT_CLOSE_SERVER_C, "server", &[]).unwrap();
    let port = free_port();
    // env loads the agent, then runs the server without LD_PRELOAD.
    let argv = vec![
        "env".into(),
        "-u".into(),
        "LD_PRELOAD".into(),
        server.display().to_string(),
        port.to_string(),
    ];
    let (err, _) = start_fails(argv, port, Duration::from_secs(2));
    assert!(err.contains("no agent answered"), "{err}");
    assert!(
        err.contains("ruled out before the start") && err.contains("dynamically linked"),
        "{err}"
    );
    assert!(err.contains("no LD_PRELOAD in its environment"), "{err}");
}
