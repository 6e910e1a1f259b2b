//! Arbiter, senders and receivers over real UDP sockets on 127.0.0.1.
//!
//! All hosts share this kernel's CLOCK_MONOTONIC. Host ids are loopback addresses
//! (127.0.0.x); the receiver of every demand is 127.0.0.1, where the test's receiver listens on
//! an ephemeral port configured as the arbiter's `preheatd_port`. Every wait is bounded.

use preheat_net::arbiter::{Arbiter, ArbiterConfig, ArbiterStats};
use preheat_net::receiver::Receiver;
use preheat_net::sender::{Grant, Sender};
use preheat_net::wire::{
    decode, encode, Allocation, Demand, Key, Msg, NetAnnouncement, SeqGen, ROLE_ARBITER,
    ROLE_SENDER,
};
use preheat_net::{host_id, now_ns, HostId};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const LEAD_NS: u64 = 65_000;
/// Generous: the suite shares 2 cores with other test binaries.
const MAX_AGE_NS: u64 = 2_000_000_000;

fn key() -> Key {
    Key::from_hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f").unwrap()
}

fn h(last: u8) -> HostId {
    host_id(Ipv4Addr::new(127, 0, 0, last))
}

fn local() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

struct Running {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Arbiter>,
}

impl Running {
    fn start(preheatd_port: u16) -> Running {
        let mut cfg = ArbiterConfig::new(local(), key());
        cfg.lead_ns = LEAD_NS;
        cfg.preheatd_port = preheatd_port;
        cfg.max_age_ns = MAX_AGE_NS;
        let mut arb = Arbiter::bind(cfg).unwrap();
        let addr = arb.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            arb.run_until(&s).unwrap();
            arb
        });
        Running { addr, stop, thread }
    }

    fn finish(self) -> ArbiterStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap().stats()
    }
}

fn receiver(rate: f64, burst: f64) -> Receiver {
    Receiver::bind(local(), key(), rate, burst, MAX_AGE_NS).unwrap()
}

/// Announcements until `timeout` passes without one.
fn drain(r: &mut Receiver, quiet: Duration) -> Vec<NetAnnouncement> {
    let mut v = Vec::new();
    while let Some((hdr, a)) = r.recv(Some(quiet)).unwrap() {
        assert_eq!(hdr.kind, preheat_net::wire::KIND_ANNOUNCE);
        v.push(a);
    }
    v
}

/// Per sender: (source, port, allocation) for every run received, and packets requested.
type SenderLog = (Vec<(HostId, u16, Allocation)>, u64);

#[test]
fn two_senders_get_slots_and_the_receiver_gets_every_announcement() {
    let mut rcv = receiver(1e6, 1e6);
    let arb = Running::start(rcv.local_addr().unwrap().port());
    let dst = h(1);
    let requests: u32 = 20;
    let senders: Vec<JoinHandle<SenderLog>> = [2u8, 3]
        .into_iter()
        .map(|id| {
            let addr = arb.addr;
            std::thread::spawn(move || {
                let mut s = Sender::new(addr, key(), h(id), Duration::from_secs(2)).unwrap();
                let mut allocs = Vec::new();
                let mut packets_total = 0u64;
                for i in 0..requests {
                    let packets = if i % 5 == 4 { 3 } else { 1 };
                    let port = if id == 2 { 11211 } else { 8080 };
                    let t0 = now_ns();
                    let grant = s.request(dst, port, packets);
                    let Grant::Scheduled { send_at_ns } = grant else {
                        panic!("sender {id} request {i}: {grant:?}");
                    };
                    assert!(
                        send_at_ns + 1_000_000 >= t0 + LEAD_NS,
                        "slot at {send_at_ns} is less than lead after {t0}"
                    );
                    let runs = s.last_allocations().to_vec();
                    assert_eq!(runs.iter().map(|a| a.slots).sum::<u16>(), packets);
                    assert_eq!(runs.iter().map(|a| a.send_at_ns).min(), Some(send_at_ns));
                    for a in runs {
                        assert_eq!((a.dst, a.dst_port), (dst, port));
                        allocs.push((h(id), port, a));
                    }
                    packets_total += u64::from(packets);
                    if i % 4 == 0 {
                        s.wait_until(send_at_ns);
                        assert!(now_ns() >= send_at_ns);
                    }
                }
                let c = s.counters();
                assert_eq!((c.scheduled, c.unscheduled), (u64::from(requests), 0));
                (allocs, packets_total)
            })
        })
        .collect();
    let mut allocs = Vec::new();
    let mut packets = 0;
    for t in senders {
        let (a, p) = t.join().unwrap();
        allocs.extend(a);
        packets += p;
    }
    let anns = drain(&mut rcv, Duration::from_millis(300));
    let stats = arb.finish();

    // One announcement per allocation (run of slots), with the same flow, port, time, count.
    assert_eq!(anns.len(), allocs.len(), "announcements {anns:?}");
    let by_flow: HashMap<(u64, u64), &NetAnnouncement> =
        anns.iter().map(|a| ((a.flow, a.arrival_ns), a)).collect();
    for (src, port, a) in &allocs {
        let n = by_flow
            .get(&(a.flow, a.send_at_ns))
            .unwrap_or_else(|| panic!("no announcement for {a:?}"));
        assert_eq!((n.src, n.dst_port, n.packets), (*src, *port, a.slots));
        assert_eq!(
            n.arrival_ns, a.send_at_ns,
            "link latency estimate defaults to 0"
        );
    }
    // The receiver never gets two packets in one slot.
    let slot = u64::from(allocs[0].2.slot_ns);
    let mut times: Vec<(u64, u64)> = anns
        .iter()
        .map(|a| (a.arrival_ns, a.arrival_ns + u64::from(a.packets) * slot))
        .collect();
    times.sort_unstable();
    for w in times.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping slots at the receiver: {w:?}");
    }
    assert_eq!(stats.demands, 2 * u64::from(requests));
    assert_eq!(stats.packets, packets);
    assert_eq!(stats.allocations, allocs.len() as u64);
    assert_eq!(stats.announcements, allocs.len() as u64);
    assert_eq!(stats.gate.accepted, 2 * u64::from(requests));
    assert_eq!(stats.gate.dropped(), 0);
    assert_eq!(rcv.counters().accepted, anns.len() as u64);
    println!("arbiter stats: {stats:?}");
}

/// Several processes of one host share its `HostId`: each `Sender` draws its own sequence
/// stream, so concurrent demands are not mistaken for replays.
#[test]
fn concurrent_senders_sharing_a_host_id_are_all_scheduled() {
    let mut rcv = receiver(1e6, 1e6);
    let arb = Running::start(rcv.local_addr().unwrap().port());
    let per_thread = 25u64;
    let threads: Vec<JoinHandle<()>> = [4u8, 4, 4, 5]
        .into_iter()
        .map(|id| {
            let addr = arb.addr;
            std::thread::spawn(move || {
                let mut s = Sender::new(addr, key(), h(id), Duration::from_secs(2)).unwrap();
                for _ in 0..per_thread {
                    let g = s.request(h(1), 80, 2);
                    assert!(matches!(g, Grant::Scheduled { .. }), "{g:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let anns = drain(&mut rcv, Duration::from_millis(300));
    let stats = arb.finish();
    assert_eq!(stats.gate.replayed, 0);
    assert_eq!(stats.demands, 4 * per_thread);
    assert_eq!(stats.packets, 2 * 4 * per_thread);
    assert_eq!(
        anns.iter().map(|a| u64::from(a.packets)).sum::<u64>(),
        stats.packets
    );
    let slot = 1231;
    let mut times: Vec<(u64, u64)> = anns
        .iter()
        .map(|a| (a.arrival_ns, a.arrival_ns + u64::from(a.packets) * slot))
        .collect();
    times.sort_unstable();
    for w in times.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping slots at the receiver: {w:?}");
    }
}

fn recv_msgs(sock: &UdpSocket, want: usize, quiet: Duration) -> Vec<Msg> {
    sock.set_read_timeout(Some(quiet)).unwrap();
    let mut buf = [0u8; 512];
    let mut v = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        match sock.recv(&mut buf) {
            Ok(n) => v.push(decode(&key(), &buf[..n]).unwrap().1),
            Err(_) if v.len() >= want => break,
            Err(_) => {}
        }
    }
    v
}

#[test]
fn arbiter_drops_spoofed_replayed_stale_and_malformed_datagrams() {
    let mut rcv = receiver(1e6, 1e6);
    let arb = Running::start(rcv.local_addr().unwrap().port());
    let sock = UdpSocket::bind(local()).unwrap();
    sock.connect(arb.addr).unwrap();
    let me = h(9);
    let demand = |flow| {
        Msg::Demand(Demand {
            dst: h(1),
            dst_port: 11211,
            packets: 1,
            flow,
        })
    };
    let mut seq = SeqGen::new();
    let now = now_ns();
    let valid = encode(&key(), me, seq.next_seq(), now, &demand(1));
    sock.send(&valid).unwrap();
    sock.send(&valid).unwrap(); // replay
    let spoofed = encode(&Key([9; 32]), me, seq.next_seq(), now, &demand(2));
    sock.send(&spoofed).unwrap();
    let old = now.saturating_sub(2 * MAX_AGE_NS);
    sock.send(&encode(&key(), me, seq.next_seq(), old, &demand(3)))
        .unwrap();
    let future = now + 2 * MAX_AGE_NS;
    sock.send(&encode(&key(), me, seq.next_seq(), future, &demand(4)))
        .unwrap();
    sock.send(b"not a preheat datagram at all, but long enough to parse")
        .unwrap();
    let forged_alloc = Msg::Allocation(Allocation {
        flow: 5,
        dst: h(1),
        dst_port: 1,
        send_at_ns: now,
        slots: 1,
        slot_ns: 1,
    });
    // Authenticated, but not a kind the arbiter accepts.
    sock.send(&encode(&key(), me, seq.next_seq(), now, &forged_alloc))
        .unwrap();
    let hello = Msg::Hello { role: ROLE_SENDER };
    sock.send(&encode(&key(), me, seq.next_seq(), now, &hello))
        .unwrap();

    let got = recv_msgs(&sock, 2, Duration::from_millis(200));
    let anns = drain(&mut rcv, Duration::from_millis(200));
    let stats = arb.finish();

    assert!(got.contains(&Msg::Hello { role: ROLE_ARBITER }), "{got:?}");
    let allocs: Vec<&Allocation> = got
        .iter()
        .filter_map(|m| match m {
            Msg::Allocation(a) => Some(a),
            _ => None,
        })
        .collect();
    assert_eq!(allocs.len(), 1, "{got:?}");
    assert_eq!(allocs[0].flow, 1);
    assert_eq!(anns.len(), 1, "{anns:?}");
    assert_eq!((anns[0].flow, anns[0].src), (1, me));

    let g = stats.gate;
    assert_eq!(g.received, 8);
    assert_eq!(g.accepted, 2);
    assert_eq!(g.replayed, 1);
    assert_eq!(g.bad_mac, 1);
    assert_eq!(g.stale, 2);
    assert_eq!(g.malformed, 2);
    assert_eq!(
        (stats.demands, stats.announcements, stats.hellos),
        (1, 1, 1)
    );
}

#[test]
fn receiver_drops_spoofed_replayed_stale_and_flooded_announcements() {
    // Burst 3, then one per second: a flood from one sender is cut off.
    let mut rcv = receiver(1.0, 3.0);
    let to = rcv.local_addr().unwrap();
    let sock = UdpSocket::bind(local()).unwrap();
    let arbiter = h(100);
    let ann = |flow| {
        Msg::Announce(NetAnnouncement {
            src: h(2),
            dst_port: 8080,
            arrival_ns: now_ns() + 65_000,
            flow,
            packets: 1,
        })
    };
    let now = now_ns();
    let mut seq = SeqGen::new();
    let mut next = || seq.next_seq();
    let valid = encode(&key(), arbiter, next(), now, &ann(1));
    sock.send_to(&valid, to).unwrap();
    sock.send_to(&valid, to).unwrap(); // replayed
    let spoof = encode(&Key([3; 32]), arbiter, next(), now, &ann(2));
    sock.send_to(&spoof, to).unwrap();
    let stale = encode(
        &key(),
        arbiter,
        next(),
        now.saturating_sub(2 * MAX_AGE_NS),
        &ann(3),
    );
    sock.send_to(&stale, to).unwrap();
    let demand = Msg::Demand(Demand {
        dst: h(1),
        dst_port: 8080,
        packets: 1,
        flow: 4,
    });
    sock.send_to(&encode(&key(), arbiter, next(), now, &demand), to)
        .unwrap(); // not an announcement
    sock.send_to(&[0u8; 3], to).unwrap(); // short
    for flow in 10..15 {
        sock.send_to(&encode(&key(), arbiter, next(), now, &ann(flow)), to)
            .unwrap();
    }
    let got = drain(&mut rcv, Duration::from_millis(200));
    let flows: Vec<u64> = got.iter().map(|a| a.flow).collect();
    assert_eq!(flows, vec![1, 10, 11]);
    let c = *rcv.counters();
    assert_eq!(c.received, 11);
    assert_eq!(c.accepted, 3);
    assert_eq!(c.replayed, 1);
    assert_eq!(c.bad_mac, 1);
    assert_eq!(c.stale, 1);
    assert_eq!(c.malformed, 2);
    assert_eq!(c.rate_limited, 3);
}

#[test]
fn receiver_timeouts_are_bounded() {
    let mut rcv = receiver(1e6, 1e6);
    for ms in [0u64, 5, 40] {
        let t = Instant::now();
        assert!(rcv.recv(Some(Duration::from_millis(ms))).unwrap().is_none());
        let e = t.elapsed();
        assert!(
            e >= Duration::from_millis(ms) && e < Duration::from_millis(ms + 50),
            "{e:?}"
        );
    }
}

#[test]
fn sender_fails_open_without_an_arbiter() {
    // Nothing listens on this port: the kernel answers with ICMP port unreachable.
    let port = UdpSocket::bind(local()).unwrap().local_addr().unwrap();
    let timeout = Duration::from_millis(200);
    let mut s = Sender::new(port, key(), h(2), timeout).unwrap();
    let t = Instant::now();
    let g = s.request(h(1), 80, 1);
    let e = t.elapsed();
    assert!(matches!(g, Grant::Unscheduled { .. }), "{g:?}");
    assert!(e < timeout + Duration::from_millis(50), "{e:?}");
    let c = s.counters();
    assert_eq!((c.unscheduled, c.scheduled), (1, 0));
    assert_eq!(c.arbiter_errors + c.timeouts, 1);

    // An arbiter that never answers: Unscheduled right after the timeout.
    let hole = UdpSocket::bind(local()).unwrap();
    for ms in [30u64, 120] {
        let timeout = Duration::from_millis(ms);
        let mut s = Sender::new(hole.local_addr().unwrap(), key(), h(2), timeout).unwrap();
        let t = Instant::now();
        let g = s.request(h(1), 80, 1);
        let e = t.elapsed();
        assert_eq!(
            g,
            Grant::Unscheduled {
                reason: "no allocation before the timeout"
            }
        );
        assert!(
            e >= timeout && e < timeout + Duration::from_millis(50),
            "{ms} ms: {e:?}"
        );
        assert_eq!(s.counters().timeouts, 1);
        println!("timeout {ms} ms: unscheduled after {e:?}");
    }
}

#[test]
fn sender_ignores_forged_and_stray_allocations() {
    // A fake arbiter answers each demand first with a wrong-key allocation, then with one for
    // another flow, then with the right one.
    let fake = UdpSocket::bind(local()).unwrap();
    let addr = fake.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        fake.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (n, from) = fake.recv_from(&mut buf).unwrap();
        let (_, Msg::Demand(d)) = decode(&key(), &buf[..n]).unwrap() else {
            panic!("expected a demand")
        };
        let a = |flow| {
            Msg::Allocation(Allocation {
                flow,
                dst: d.dst,
                dst_port: d.dst_port,
                send_at_ns: now_ns() + 100_000,
                slots: d.packets,
                slot_ns: 1231,
            })
        };
        let now = now_ns();
        let mut seq = SeqGen::new();
        for (k, flow) in [(Key([1; 32]), d.flow), (key(), d.flow ^ 1), (key(), d.flow)] {
            let b = encode(&k, 1, seq.next_seq(), now, &a(flow));
            fake.send_to(&b, from).unwrap();
        }
    });
    let mut s = Sender::new(addr, key(), h(2), Duration::from_secs(2)).unwrap();
    let g = s.request(h(1), 80, 2);
    t.join().unwrap();
    assert!(matches!(g, Grant::Scheduled { .. }), "{g:?}");
    let c = s.counters();
    assert_eq!((c.gate.bad_mac, c.stray, c.scheduled), (1, 1, 1));
}
