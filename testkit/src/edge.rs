//! Edge proxies in front of test replicas, as real processes on loopback:
//! the built-in `openshell-gateway edge` ([`Edge`]) and nginx rendered from
//! `deploy/nginx` ([`Nginx`]). Both are stopped by their own PID on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin, http_get, is_running, metric_value, signal};

const READY_WAIT: Duration = Duration::from_secs(30);
const RELOADS_OK: &str = "openshell_edge_route_reloads_total{result=\"ok\"}";
const RELOADS_FAILED: &str = "openshell_edge_route_reloads_total{result=\"error\"}";

/// `{"replicas":{id:url,...}}` for `--routes-file`.
fn routes_json(replicas: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = replicas
        .iter()
        .map(|(id, url)| (id.to_string(), serde_json::Value::from(*url)))
        .collect();
    serde_json::json!({ "replicas": map }).to_string()
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write temp file");
    std::fs::rename(&tmp, path).expect("rename into place");
}

/// A running `openshell-gateway edge` with a routes file (re-read on SIGHUP)
/// and a metrics listener.
pub struct Edge {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
}

impl Edge {
    /// Routes `(id, "http://127.0.0.1:PORT")` through a routes file.
    pub fn start(replicas: &[(&str, &str)]) -> Self {
        Self::start_with(replicas, &[])
    }

    /// Like [`Edge::start`] with further `edge` arguments (for example
    /// `--replica ID=URL`).
    pub fn start_with(replicas: &[(&str, &str)], extra_args: &[&str]) -> Self {
        Self::start_in(&[], "127.0.0.1:0".parse().unwrap(), replicas, extra_args)
    }

    /// Like [`Edge::start_with`], started through `launcher` (a lab host's,
    /// see [`crate::lab::Lab::launcher`]) and listening on `listen` (the
    /// metrics listener on a free port of the same address). A
    /// non-loopback address needs `--allow-public` in `extra_args`.
    pub fn start_in(
        launcher: &[String],
        listen: SocketAddr,
        replicas: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("openshell-edge-")
            .tempdir()
            .expect("temp dir");
        let routes = dir.path().join("routes.json");
        write_atomically(&routes, &routes_json(replicas));
        let ready = dir.path().join("ready.json");
        let log = std::fs::File::create(dir.path().join("edge.log")).expect("edge log");
        let mut command = match launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(bin("openshell-gateway"));
                command
            }
            None => Command::new(bin("openshell-gateway")),
        };
        let metrics_listen = SocketAddr::new(listen.ip(), 0);
        let mut child = command
            .arg("edge")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--metrics-listen")
            .arg(metrics_listen.to_string())
            .arg("--routes-file")
            .arg(&routes)
            .arg("--ready-file")
            .arg(&ready)
            .args(extra_args)
            .env(
                "RUST_LOG",
                std::env::var("OPENSHELL_TEST_LOG")
                    .unwrap_or_else(|_| "info,openshell_gateway::edge=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start openshell-gateway edge");
        let started = Instant::now();
        let info: serde_json::Value = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break serde_json::from_str(&text).expect("edge ready file JSON");
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "openshell-gateway edge exited early ({status}); log:\n{}",
                    std::fs::read_to_string(dir.path().join("edge.log")).unwrap_or_default()
                );
            }
            if started.elapsed() > READY_WAIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("openshell-gateway edge not ready after {READY_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Self {
            child: Some(child),
            url: info["url"].as_str().expect("url").to_owned(),
            grpc_addr: info["grpc"].as_str().expect("grpc").parse().unwrap(),
            metrics_addr: info["metrics"].as_str().expect("metrics").parse().unwrap(),
            dir,
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn routes_file(&self) -> PathBuf {
        self.dir.path().join("routes.json")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("edge.log")).unwrap_or_default()
    }

    pub fn metrics(&self) -> String {
        http_get(self.metrics_addr, "/metrics")
    }

    pub fn metric(&self, sample: &str) -> Option<f64> {
        metric_value(&self.metrics(), sample)
    }

    /// Rewrites the routes file, sends SIGHUP and waits until the edge has
    /// applied it.
    pub fn set_routes(&self, replicas: &[(&str, &str)]) {
        assert!(
            self.reload_with(&routes_json(replicas)),
            "the edge rejected the routes; log:\n{}",
            self.log()
        );
    }

    /// Writes `text` as the routes file and sends SIGHUP; true when the edge
    /// applied it, false when it rejected it (and kept its routes).
    pub fn reload_with(&self, text: &str) -> bool {
        let counts = || {
            let metrics = self.metrics();
            (
                metric_value(&metrics, RELOADS_OK).unwrap_or(0.0),
                metric_value(&metrics, RELOADS_FAILED).unwrap_or(0.0),
            )
        };
        let (ok, failed) = counts();
        write_atomically(&self.routes_file(), text);
        signal(self.pid().expect("edge is running"), libc::SIGHUP);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let (now_ok, now_failed) = counts();
            if now_ok > ok {
                return true;
            }
            if now_failed > failed {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the edge did not reload within 10 s; log:\n{}", self.log());
    }

    /// SIGTERM (the edge drains for up to 5 s), then SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(8) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The nginx binary; panics when nginx is not installed.
pub fn nginx_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("nginx is not installed: install nginx (make test does: scripts/setup.sh)")
        })
}

/// `deploy/nginx/render.py` of this workspace.
pub fn nginx_render_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nginx/render.py")
}

/// `deploy/nginx/render.py` into `prefix`, listening on `addr`.
fn render_config(prefix: &Path, addr: SocketAddr, replicas: &[(&str, &str)], args: &[&str]) {
    let mut render = Command::new("python3");
    render
        .arg(nginx_render_script())
        .arg("--prefix")
        .arg(prefix)
        .arg("--listen")
        .arg(addr.to_string());
    for (id, url) in replicas {
        render.arg("--replica").arg(format!("{id}={url}"));
    }
    render.args(args);
    let rendered = render
        .output()
        .expect("run python3 deploy/nginx/render.py (is python3 installed?)");
    assert!(
        rendered.status.success(),
        "render.py failed: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
}

/// nginx running `deploy/nginx/openshell-edge.conf.template` (or a test's own
/// configuration) from a private prefix directory (`daemon off`, so the child
/// is the master process).
pub struct Nginx {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub addr: SocketAddr,
}

impl Nginx {
    /// Routes `(id, "127.0.0.1:PORT")` (an `http://` prefix is accepted).
    pub fn start(replicas: &[(&str, &str)]) -> Self {
        Self::start_with(replicas, &[])
    }

    /// Like [`Nginx::start`] with further `render.py` arguments (for example
    /// `--max-concurrent-streams 16`).
    pub fn start_with(replicas: &[(&str, &str)], render_args: &[&str]) -> Self {
        Self::launch(|prefix, addr| {
            render_config(prefix, addr, replicas, render_args);
        })
    }

    /// nginx with a configuration of the test's own: `template` is a whole
    /// `nginx.conf` in which `@@PREFIX@@` and `@@LISTEN@@` are replaced by
    /// the prefix directory and the `127.0.0.1:PORT` to listen on.
    pub fn start_config(template: &str) -> Self {
        Self::launch(|prefix, addr| {
            let text = template
                .replace("@@PREFIX@@", &prefix.display().to_string())
                .replace("@@LISTEN@@", &addr.to_string());
            std::fs::write(prefix.join("nginx.conf"), text).expect("write nginx.conf");
        })
    }

    /// Writes the configuration with `configure(prefix, listen address)` and
    /// starts nginx on it.
    fn launch(mut configure: impl FnMut(&Path, SocketAddr)) -> Self {
        let nginx = nginx_bin();
        let dir = tempfile::Builder::new()
            .prefix("openshell-nginx-")
            .tempdir()
            .expect("temp dir");
        let prefix = dir.path().to_path_buf();
        // nginx cannot report a port it picked: take a free one, and pick
        // again if another process grabbed it first.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = {
                let probe = TcpListener::bind("127.0.0.1:0").expect("probe port");
                probe.local_addr().unwrap().port()
            };
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            configure(&prefix, addr);
            let _ = std::fs::remove_file(prefix.join("error.log"));
            let mut child = Command::new(&nginx)
                .arg("-p")
                .arg(&prefix)
                .args(["-c", "nginx.conf", "-g"])
                .arg(format!("daemon off; pid {}/nginx.pid;", prefix.display()))
                .arg("-e")
                .arg(prefix.join("error.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start nginx");
            let started = Instant::now();
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    last_error =
                        std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Self {
                        child: Some(child),
                        dir,
                        url: format!("http://{addr}"),
                        addr,
                    };
                }
                if started.elapsed() > READY_WAIT {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("nginx not listening on {addr} after {READY_WAIT:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !last_error.contains("Address already in use") {
                break;
            }
        }
        panic!("nginx did not start; error.log:\n{last_error}");
    }

    /// Renders `deploy/nginx` again with `replicas`, sends SIGHUP and waits
    /// (at most 10 s) until the workers of the old configuration are gone:
    /// from then on every call uses the new routes. Async, so that clients
    /// on the same runtime see their connection to an old worker close (and
    /// reconnect) while it waits.
    pub async fn set_routes(&self, replicas: &[(&str, &str)]) {
        let master = self.pid().expect("nginx is running");
        let old_workers = children_of(master);
        render_config(self.prefix(), self.addr, replicas, &[]);
        signal(master, libc::SIGHUP);
        let swapped = crate::eventually(Duration::from_secs(10), || {
            let workers = children_of(master);
            !workers.is_empty() && workers.iter().all(|w| !old_workers.contains(w))
        })
        .await;
        assert!(
            swapped,
            "nginx did not replace its workers within 10 s; error.log:\n{}",
            self.log()
        );
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn prefix(&self) -> &Path {
        self.dir.path()
    }

    /// nginx's error log (connect failures to replicas show up here).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// Fast shutdown (SIGTERM to the master), then SIGKILL to the master and
    /// any worker it left behind.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let master = child.id() as i32;
        let workers = children_of(master);
        signal(master, libc::SIGTERM);
        let started = Instant::now();
        let mut exited = false;
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = child.try_wait() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in workers {
            if is_running(pid) {
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Direct children of `pid` (Linux `/proc/PID/task/PID/children`).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
