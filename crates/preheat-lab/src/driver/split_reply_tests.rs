//! The multiplexed path on replies that arrive one byte at a time: every poll before the
//! last byte says "incomplete", the poll after it gives the outcome, and the connection
//! stays usable for the next request.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::http::{http_get, http_path};
use super::redis::resp_get;
use super::tests::spec;
use super::*;
/// Serve `replies` (one per request, in order) one byte at a time, in lockstep with the
/// test, which polls after every byte; returns the outcomes.
fn exchange(w: &WorkloadSpec, wait: Wait, replies: &[&[u8]]) -> Vec<Outcome> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let request_len = match w.protocol {
        Protocol::Memcached => super::memcached::get(&w.key).len(),
        Protocol::Redis => resp_get(w.key.as_bytes()).len(),
        Protocol::Http => http_get(&http_path(&w.key)).len(),
        Protocol::Mysql => unreachable!(),
    };
    let (wrote_tx, wrote_rx) = mpsc::channel::<()>();
    let (polled_tx, polled_rx) = mpsc::channel::<()>();
    let owned: Vec<Vec<u8>> = replies.iter().map(|r| r.to_vec()).collect();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        for reply in owned {
            let mut req = vec![0u8; request_len];
            s.read_exact(&mut req).unwrap();
            for b in reply {
                s.write_all(&[b]).unwrap();
                wrote_tx.send(()).unwrap();
                if polled_rx.recv().is_err() {
                    return;
                }
            }
        }
    });
    let mut d = connect(addr, w, wait).unwrap();
    assert!(d.raw_fd().is_some());
    let mut outcomes = Vec::new();
    for reply in replies {
        d.send_request().unwrap();
        for i in 0..reply.len() {
            wrote_rx.recv().unwrap();
            // Give loopback a moment to deliver the byte.
            std::thread::sleep(Duration::from_micros(300));
            let mut got = d.poll_reply().unwrap();
            if i + 1 < reply.len() {
                assert!(
                    got.is_none(),
                    "complete after {} of {} bytes",
                    i + 1,
                    reply.len()
                );
            } else {
                let t0 = Instant::now();
                while got.is_none() && t0.elapsed() < Duration::from_secs(2) {
                    got = d.poll_reply().unwrap();
                }
                outcomes.push(got.expect("complete after the last byte"));
            }
            polled_tx.send(()).unwrap();
        }
    }
    drop(polled_tx);
    server.join().unwrap();
    outcomes
}

#[test]
fn memcached_split_replies() {
    let w = spec(Protocol::Memcached, "k", Some(b"hello"));
    for wait in [Wait::Block, Wait::Spin] {
        let o = exchange(
            &w,
            wait,
            &[
                b"VALUE k 0 5\r\nhello\r\nEND\r\n",
                b"END\r\n",
                b"VALUE k 0 5\r\nhellx\r\nEND\r\n",
            ],
        );
        assert_eq!(
            o.iter().map(|o| o.ok).collect::<Vec<_>>(),
            [true, false, false]
        );
        assert_eq!(o[0].kind, "get");
    }
}

#[test]
fn redis_split_replies() {
    let w = spec(Protocol::Redis, "k", Some(b"a\r\nb"));
    let o = exchange(
        &w,
        Wait::Block,
        &[b"$4\r\na\r\nb\r\n", b"$-1\r\n", b"-ERR x\r\n"],
    );
    assert_eq!(
        o.iter().map(|o| o.ok).collect::<Vec<_>>(),
        [true, false, false]
    );
}

#[test]
fn http_split_replies() {
    let w = spec(Protocol::Http, "/x", Some(b"hello world"));
    let o = exchange(
        &w,
        Wait::Block,
        &[
            b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
        ],
    );
    assert_eq!(
        o.iter().map(|o| o.ok).collect::<Vec<_>>(),
        [true, true, false]
    );
}

#[test]
fn blocking_request_still_works_after_polling() {
    // One multiplexed exchange, then a plain request() on the same driver.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = [0u8; 7];
        for _ in 0..2 {
            s.read_exact(&mut req).unwrap();
            s.write_all(b"END\r\n").unwrap();
        }
    });
    let mut d = connect(addr, &spec(Protocol::Memcached, "k", None), Wait::Block).unwrap();
    d.send_request().unwrap();
    let t0 = Instant::now();
    let mut got = None;
    while got.is_none() && t0.elapsed() < Duration::from_secs(2) {
        got = d.poll_reply().unwrap();
    }
    assert!(got.unwrap().ok);
    assert!(d.request().unwrap().ok);
    server.join().unwrap();
}

#[test]
fn closed_connection_is_an_error_while_polling() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = [0u8; 7];
        s.read_exact(&mut req).unwrap();
        s.write_all(b"VALUE k 0 5\r\nhe").unwrap();
    });
    let mut d = connect(addr, &spec(Protocol::Memcached, "k", None), Wait::Spin).unwrap();
    d.send_request().unwrap();
    server.join().unwrap();
    let t0 = Instant::now();
    let err = loop {
        match d.poll_reply() {
            Ok(None) if t0.elapsed() < Duration::from_secs(2) => continue,
            Ok(o) => panic!("unexpected {o:?}"),
            Err(e) => break e,
        }
    };
    assert!(
        format!("{err:#}").contains("closed the connection"),
        "{err:#}"
    );
}
