//! `preheat-kv`: the bundled default server of the preheat toolkit.
//!
//! preheat warms the CPU caches of latency-critical servers before requests
//! arrive. To demonstrate and test that without installing anything, it ships
//! this small but realistic target: a memcached-like key-value server with a
//! single-threaded, level-triggered epoll loop built directly on libc
//! (`epoll_wait`, `accept4`, `read`, `send`, `close`), which is exactly the
//! shape the preheat LD_PRELOAD agent interposes on to find request
//! boundaries.
//!
//! It speaks a byte-compatible subset of the memcached text protocol
//! (`get`, `set`, `delete`, `flush_all`, `stats`, `version`, `quit`) and can
//! preload deterministic items (`key:0` .. `key:N-1`) so that GETs hit real
//! data from the first request.
//!
//! Modules: [`protocol`] is the pure request parser, [`store`] the item
//! storage, [`server`] the event loop and command execution.

// A standalone program with its own epoll/socket FFI (it links no preheat crate): the workspace
// denies `unsafe_code`, this server allows it.
#![allow(unsafe_code)]

mod execute;
mod limits;
mod protocol;
mod server;
mod store;

use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use server::Config;

const DEFAULT_LISTEN: &str = "127.0.0.1:11311";

const HELP: &str = "\
preheat-kv - small memcached-compatible key-value server bundled with preheat

A single-threaded epoll server speaking a subset of the memcached text
protocol, used as the default target of the preheat demo and tests.

USAGE:
    preheat-kv [OPTIONS]

OPTIONS:
    --listen ADDR        Address to listen on [default: 127.0.0.1:11311]
    --port P             Shorthand: listen on port P (host from --listen);
                         0 lets the OS choose (see --ready-file)
    --items N            Preload N items key:0 .. key:N-1 [default: 1000]
    --value-size B       Size of each preloaded value in bytes, at most
                         1048576 [default: 100]
    --ready-file PATH    Once listening, atomically write \"ready <port>\\n\"
                         to PATH (removed again on clean exit)
    -q, --quiet          Do not log to stderr
    -h, --help           Print this help
    -V, --version        Print the version

PROTOCOL:
    get <key>*                                   VALUE ... / END
    set <key> <flags> <exptime> <bytes> [noreply]  STORED
    delete <key> [noreply]                       DELETED / NOT_FOUND
    flush_all [delay] [noreply]                  OK
    stats | stats reset                          STAT lines + END / RESET
    version                                      VERSION preheat-kv <ver>
    quit
    Keys are at most 250 bytes, values at most 1 MiB. exptime follows
    memcached: 0 never expires, up to 30 days is relative seconds, larger is
    an absolute Unix time, negative is already expired.

PRELOADED DATA:
    key:I holds B bytes where byte J is 'a' + (I + J) % 26, flags 0.

SIGNALS:
    SIGTERM or SIGINT: close all connections and exit with status 0.
";

#[derive(Debug, PartialEq, Eq)]
enum Action {
    Run(Config),
    Help,
    Version,
}

fn main() -> ExitCode {
    let config = match parse_args(std::env::args_os().skip(1)) {
        Ok(Action::Run(config)) => config,
        Ok(Action::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(Action::Version) => {
            println!("preheat-kv {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("preheat-kv: {message}\nTry 'preheat-kv --help'.");
            return ExitCode::from(2);
        }
    };
    match server::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("preheat-kv: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line (without the program name). Accepts both
/// `--flag value` and `--flag=value`.
fn parse_args<I: IntoIterator<Item = OsString>>(args: I) -> Result<Action, String> {
    let mut listen: Option<String> = None;
    let mut port: Option<u16> = None;
    let mut items: usize = 1000;
    let mut value_size: usize = 100;
    let mut ready_file: Option<PathBuf> = None;
    let mut quiet = false;

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("invalid argument {a:?}"))?;
        let (flag, mut inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(OsString::from(value)))
            }
            _ => (arg, None),
        };
        let mut value = || -> Result<OsString, String> {
            inline
                .take()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Action::Help),
            "-V" | "--version" => return Ok(Action::Version),
            "-q" | "--quiet" => quiet = true,
            "--listen" => listen = Some(utf8(&flag, value()?)?),
            "--port" => port = Some(number(&flag, value()?)?),
            "--items" => items = number(&flag, value()?)?,
            "--value-size" => value_size = number(&flag, value()?)?,
            "--ready-file" => ready_file = Some(PathBuf::from(value()?)),
            _ => return Err(format!("unknown argument '{flag}'")),
        }
        if inline.is_some() {
            return Err(format!("{flag} does not take a value"));
        }
    }

    if value_size > protocol::MAX_VALUE_LEN {
        return Err(format!(
            "--value-size {value_size} exceeds the {} byte value limit",
            protocol::MAX_VALUE_LEN
        ));
    }
    if items.checked_mul(value_size + 32).is_none() {
        return Err("--items × --value-size is too large".to_string());
    }
    let listen_text = listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let mut addr = resolve(listen_text)?;
    if let Some(port) = port {
        addr.set_port(port);
    }
    Ok(Action::Run(Config {
        listen: addr,
        items,
        value_size,
        ready_file,
        quiet,
    }))
}

fn utf8(flag: &str, value: OsString) -> Result<String, String> {
    value
        .into_string()
        .map_err(|v| format!("{flag}: invalid value {v:?}"))
}

fn number<T: std::str::FromStr>(flag: &str, value: OsString) -> Result<T, String> {
    let text = utf8(flag, value)?;
    text.parse()
        .map_err(|_| format!("{flag}: invalid number '{text}'"))
}

fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.to_socket_addrs()
        .map_err(|e| format!("--listen {text}: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen {text}: no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Action, String> {
        parse_args(args.iter().map(OsString::from))
    }

    fn config(args: &[&str]) -> Config {
        match parse(args) {
            Ok(Action::Run(config)) => config,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = config(&[]);
        assert_eq!(c.listen, "127.0.0.1:11311".parse().unwrap());
        assert_eq!((c.items, c.value_size, c.quiet), (1000, 100, false));
        assert_eq!(c.ready_file, None);
    }

    #[test]
    fn all_flags() {
        let c = config(&[
            "--listen",
            "0.0.0.0:5000",
            "--items=7",
            "--value-size",
            "3",
            "--ready-file",
            "/tmp/r",
            "--quiet",
        ]);
        assert_eq!(c.listen, "0.0.0.0:5000".parse().unwrap());
        assert_eq!((c.items, c.value_size, c.quiet), (7, 3, true));
        assert_eq!(c.ready_file, Some(PathBuf::from("/tmp/r")));
    }

    #[test]
    fn port_overrides_listen_port_in_any_order() {
        assert_eq!(
            config(&["--port", "0"]).listen,
            "127.0.0.1:0".parse().unwrap()
        );
        let c = config(&["--port", "9", "--listen", "[::1]:1"]);
        assert_eq!(c.listen, "[::1]:9".parse().unwrap());
        assert!(config(&["--listen", "localhost:7"])
            .listen
            .ip()
            .is_loopback());
    }

    #[test]
    fn help_version_and_errors() {
        assert_eq!(parse(&["--help"]), Ok(Action::Help));
        assert_eq!(parse(&["--items", "1", "-h"]), Ok(Action::Help));
        assert_eq!(parse(&["-V"]), Ok(Action::Version));
        for bad in [
            &["--bogus"][..],
            &["--port"],
            &["--port", "70000"],
            &["--items", "-1"],
            &["--value-size", "1048577"],
            &["--listen", "not an address"],
            &["--quiet=yes"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
