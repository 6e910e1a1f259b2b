//! Real programs from Debian packages on fixed inputs, the stand-ins for the SPEC CPU2000
//! programs that are not bundled: each preset generates its input once (deterministically) in a
//! scratch directory and runs one fixed job; the metric is jobs per CPU-second (the job's CPU
//! time, its children included, from the kernel's resource usage when it is reaped).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A program preset.
pub struct Preset {
    pub name: &'static str,
    /// The SPEC CPU2000 program it stands for.
    pub stands_for: &'static str,
    /// The executable looked up in PATH, and its Debian package.
    pub exe: &'static str,
    pub package: &'static str,
}

pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "gzip",
        stands_for: "gzip",
        exe: "gzip",
        package: "gzip",
    },
    Preset {
        name: "xz",
        stands_for: "gzip (stronger compressor, larger working set)",
        exe: "xz",
        package: "xz-utils",
    },
    Preset {
        name: "sqlite3",
        stands_for: "parser/twolf (pointer-rich data structures)",
        exe: "sqlite3",
        package: "sqlite3",
    },
    Preset {
        name: "cc",
        stands_for: "gcc",
        exe: "cc",
        package: "gcc",
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The preset called `name`, or the error that lists every workload there is.
pub fn known(name: &str) -> Result<&'static Preset> {
    preset(name).with_context(|| {
        format!(
            "unknown workload {name:?}: bundled chase, stream, branchy; programs {}; or give a \
             program after `--`",
            PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// A job ready to run: its argv, the file for its standard input, and its working directory.
pub struct Job {
    pub argv: Vec<String>,
    pub stdin: Option<PathBuf>,
    pub dir: PathBuf,
}

impl Job {
    /// The job's command, started at `SCHED_FIFO` `fifo` if given (see `proc::dying_with_us`).
    pub fn command(&self, fifo: Option<i32>) -> Result<Command> {
        let mut c = super::proc::dying_with_us(&self.argv[0], &self.argv[1..], fifo)?;
        c.current_dir(&self.dir);
        c.stdout(std::process::Stdio::null());
        match &self.stdin {
            Some(p) => {
                c.stdin(std::fs::File::open(p).with_context(|| format!("{}", p.display()))?);
            }
            None => {
                c.stdin(std::process::Stdio::null());
            }
        }
        Ok(c)
    }
}

/// Text with the statistics of prose, deterministic: compressible but not trivially.
fn text(bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "cache",
        "affinity",
        "core",
        "quantum",
        "miss",
        "line",
        "working",
        "set",
        "scheduler",
        "the",
        "of",
        "and",
        "a",
        "to",
        "in",
        "is",
        "process",
        "memory",
        "state",
        "reload",
        "chip",
        "shared",
        "private",
        "level",
    ];
    let mut s = String::with_capacity(bytes + 16);
    let mut rng = StdRng::seed_from_u64(0x2545_F491_4F6C_DD1D);
    while s.len() < bytes {
        let x: u64 = rng.gen();
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(if x.is_multiple_of(11) { '\n' } else { ' ' });
        if x.is_multiple_of(37) {
            let _ = write!(s, "{} ", x % 100_000);
        }
    }
    s
}

/// Prepare `name`'s input in `dir` and return its job. Errors name the missing package.
pub fn prepare(name: &str, dir: &Path) -> Result<Job> {
    let p = known(name)?;
    let exe = preheat_engine::host::find_program(p.exe).with_context(|| {
        format!(
            "{} is not installed (Debian package {}): workload {name} unavailable",
            p.exe, p.package
        )
    })?;
    std::fs::create_dir_all(dir)?;
    let exe = exe.to_string_lossy().to_string();
    let job = match name {
        "gzip" | "xz" => {
            let input = dir.join("input.txt");
            let size = if name == "gzip" { 6 << 20 } else { 640 << 10 };
            if !input.exists() {
                std::fs::write(&input, text(size))?;
            }
            let mut argv = vec![exe, "-c".into(), "-6".into()];
            if name == "xz" {
                argv.push("-T1".into());
            }
            argv.push(input.to_string_lossy().into());
            Job {
                argv,
                stdin: None,
                dir: dir.to_path_buf(),
            }
        }
        "sqlite3" => {
            let script = dir.join("job.sql");
            std::fs::write(
                &script,
                "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);\n\
                 WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 120000)\n\
                 INSERT INTO t SELECT x, (x * 7919) % 10007, printf('row-%08d', x * 31) FROM c;\n\
                 CREATE INDEX tk ON t(k);\n\
                 SELECT k, count(*), max(v) FROM t GROUP BY k ORDER BY 2 DESC LIMIT 3;\n\
                 SELECT count(*) FROM t a JOIN t b ON a.k = b.k AND a.id < b.id WHERE a.id % 97 = 0;\n",
            )?;
            Job {
                argv: vec![exe, ":memory:".into()],
                stdin: Some(script),
                dir: dir.to_path_buf(),
            }
        }
        "cc" => {
            let src = dir.join("job.c");
            let mut c = String::from("#include <stddef.h>\n");
            for i in 0..60 {
                let _ = write!(
                    c,
                    "struct s{i} {{ int a[{n}]; double d; }};\n\
                     int f{i}(struct s{i} *p, int x) {{\n  int r = 0;\n  \
                     for (int j = 0; j < {n}; j++) {{ r += p->a[j] * (x ^ j); \
                     if (r % {m} == 0) r ^= j << 3; else r -= x; }}\n  \
                     switch (x & 7) {{ case 0: r += {i}; break; case 1: r -= {i}; break; \
                     case 2: r *= 3; break; case 3: r ^= 0x5a; break; default: r += (int)p->d; }}\n  \
                     return r;\n}}\n",
                    n = 8 + i % 13,
                    m = 3 + i % 5
                );
            }
            std::fs::write(&src, c)?;
            Job {
                argv: vec![
                    exe,
                    "-O2".into(),
                    "-c".into(),
                    src.to_string_lossy().into(),
                    "-o".into(),
                    dir.join("job.o").to_string_lossy().into(),
                ],
                stdin: None,
                dir: dir.to_path_buf(),
            }
        }
        _ => unreachable!("every preset is handled"),
    };
    Ok(job)
}
