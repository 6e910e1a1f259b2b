//! Test hosts in network namespaces: one bridge namespace and N host namespaces joined to it by
//! veth pairs, on a private /24 that exists only inside these namespaces. Everything is removed
//! on drop (also when a test panics). Needs root and iproute2; [`NetLab::new`] returns the reason
//! when it cannot build the lab, and the test reports the skip (`preheat_testsupport::skip`).

use std::process::{Child, Command, Stdio};

use preheat_engine::netns::ip;

pub struct NetLab {
    bridge_ns: String,
    hosts: Vec<(String, String)>, // (netns, ip)
    children: Vec<Child>,
}

impl NetLab {
    /// Create `names.len()` hosts; host i gets 10.233.<subnet>.<i + 1>/24.
    pub fn new(names: &[&str]) -> Result<NetLab, String> {
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(String::from))
            .unwrap_or_default();
        if uid.split_whitespace().nth(2) != Some("0") {
            return Err("network namespaces need root".into());
        }
        // Unique per lab, also for two labs of one test process at once.
        static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = LABS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10;
        let pid = std::process::id();
        let subnet = 16 + (pid + 97 * k) % 200;
        let tag = format!("ph{}{k}", pid % 100_000);
        let mut lab = NetLab {
            bridge_ns: format!("{tag}-br"),
            hosts: Vec::new(),
            children: Vec::new(),
        };
        ip(&["netns", "add", &lab.bridge_ns])?;
        ip(&["-n", &lab.bridge_ns, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &lab.bridge_ns, "link", "set", "br0", "up"])?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{tag}-{name}");
            let addr = format!("10.233.{subnet}.{}", i + 1);
            ip(&["netns", "add", &ns])?;
            lab.hosts.push((ns.clone(), addr.clone()));
            let (a, b) = (format!("{tag}h{i}"), format!("{tag}b{i}"));
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])?;
            ip(&["link", "set", &a, "netns", &ns])?;
            ip(&["link", "set", &b, "netns", &lab.bridge_ns])?;
            ip(&["-n", &lab.bridge_ns, "link", "set", &b, "master", "br0"])?;
            ip(&["-n", &lab.bridge_ns, "link", "set", &b, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &a])?;
            ip(&["-n", &ns, "link", "set", &a, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    pub fn addr(&self, host: usize) -> &str {
        &self.hosts[host].1
    }

    /// A command that runs `argv` inside host `host`'s namespace.
    pub fn cmd(&self, host: usize, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[host].0]).args(argv);
        c
    }

    /// Start a long-running process in a host; it is killed when the lab is dropped.
    pub fn spawn(
        &mut self,
        host: usize,
        argv: &[&str],
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> usize {
        let f = std::fs::File::create(log).expect("log file");
        let mut c = self.cmd(host, argv);
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("spawn in netns");
        self.children.push(child);
        self.children.len() - 1
    }

    /// Stop a process started with [`NetLab::spawn`] (SIGKILL: the point is to test crashes).
    pub fn kill(&mut self, idx: usize) {
        let c = &mut self.children[idx];
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = preheat_engine::os::send_signal(c.id(), libc::SIGTERM, false);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Processes inside the namespaces that outlived their `ip netns exec` parent.
        for (ns, _) in &self.hosts {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse() {
                        let _ = preheat_engine::os::send_signal(pid, libc::SIGKILL, false);
                    }
                }
            }
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["netns", "del", &self.bridge_ns]);
    }
}
