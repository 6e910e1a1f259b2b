//! The skip log from several processes and threads at once: every line whole, none lost.

use std::process::Command;

#[test]
fn parallel_skips_from_threads_and_processes_append_whole_lines() {
    if std::env::var_os("PREHEAT_TESTSUPPORT_CHILD").is_some() {
        // A child: skip from 8 threads at once.
        let threads: Vec<_> = (0..8)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("child-thread-{i}"))
                    .spawn(move || {
                        for k in 0..25 {
                            preheat_testsupport::skip!(
                                "memcached",
                                "thread {i} skip {k}\twith a tab"
                            );
                        }
                    })
                    .unwrap()
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("skips.tsv");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "parallel_skips_from_threads_and_processes_append_whole_lines",
                    "--nocapture",
                ])
                .env("PREHEAT_TESTSUPPORT_CHILD", "1")
                .env(preheat_testsupport::SKIP_LOG_ENV, &log)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * 8 * 25);
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(f.len(), 4, "{l:?}");
        assert_eq!(f[0], "rust");
        assert!(f[1].contains("::child-thread-"), "{l:?}");
        assert_eq!(f[2], "memcached");
        assert!(
            f[3].starts_with("thread ") && f[3].ends_with(" with a tab"),
            "{l:?}"
        );
    }
}
