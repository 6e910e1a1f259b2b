//! The servers `preheat load`'s tests run against, each started on a free loopback port and
//! killed (and reaped) when the test's `Servers` guard drops; `None` where the program is missing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::find_program;
use preheat_testsupport::{free_port, KillOnDrop};

/// Every server a test started; killed (and reaped) on drop, panics included.
#[derive(Default)]
pub(super) struct Servers(Vec<KillOnDrop>);

impl Servers {
    /// Start a server that listens on `port` and wait until it accepts connections.
    pub(super) fn start(&mut self, cmd: &mut Command, port: u16) -> u16 {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.0.push(KillOnDrop(child));
        let last = &mut self.0.last_mut().unwrap().0;
        preheat_testsupport::wait_port(port, last).unwrap()
    }
}

/// Send `req` on a fresh connection and read until the reply ends with `until`.
fn exchange(port: u16, req: &[u8], until: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.ends_with(until) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "server closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    out
}

pub(super) fn memcached(servers: &mut Servers) -> Option<u16> {
    let Some(mc) = find_program("memcached") else {
        preheat_testsupport::skip(
            "memcached",
            "memcached is not installed (apt-get install memcached)",
        );
        return None;
    };
    let port = free_port();
    let p = port.to_string();
    servers.start(
        Command::new(mc).args([
            "-p",
            &p,
            "-l",
            "127.0.0.1",
            "-U",
            "0",
            "-t",
            "1",
            "-u",
            "root",
        ]),
        port,
    );
    let r = exchange(port, b"set key:42 0 0 5\r\nhello\r\n", b"\r\n");
    assert_eq!(r, b"STORED\r\n");
    Some(port)
}

pub(super) fn preheat_kv(servers: &mut Servers) -> Option<u16> {
    let kv = Path::new(env!("CARGO_BIN_EXE_preheat"))
        .parent()
        .unwrap()
        .join("preheat-kv");
    if !kv.is_file() {
        preheat_testsupport::skip!(
            "workspace-build",
            "{} is missing (build the workspace first: cargo build --workspace)",
            kv.display()
        );
        return None;
    }
    let port = free_port();
    Some(servers.start(
        Command::new(kv).args(["--port", &port.to_string(), "--quiet"]),
        port,
    ))
}

pub(super) fn redis(servers: &mut Servers) -> Option<u16> {
    let Some(rs) = find_program("redis-server") else {
        preheat_testsupport::skip(
            "redis-server",
            "redis-server is not installed (apt-get install redis-server)",
        );
        return None;
    };
    let port = free_port();
    let p = port.to_string();
    servers.start(
        Command::new(rs).args([
            "--port",
            &p,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]),
        port,
    );
    let r = exchange(
        port,
        b"*3\r\n$3\r\nSET\r\n$6\r\nkey:42\r\n$5\r\nhello\r\n",
        b"\r\n",
    );
    assert_eq!(r, b"+OK\r\n");
    Some(port)
}

pub(super) fn nginx(servers: &mut Servers, dir: &Path) -> Option<u16> {
    let Some(ng) = find_program("nginx") else {
        preheat_testsupport::skip("nginx", "nginx is not installed (apt-get install nginx)");
        return None;
    };
    let port = free_port();
    let d = dir.display();
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::write(dir.join("www/index.html"), "hello from nginx\n").unwrap();
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n  \
             fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n  \
             server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n"
        ),
    )
    .unwrap();
    Some(servers.start(
        Command::new(ng).arg("-p").arg(dir).arg("-c").arg(&conf),
        port,
    ))
}
