//! Finding (or starting) PostgreSQL and Redis for local runs.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The workspace root (this crate lives at `crates/lab`, two levels below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The cargo that runs us.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| breakwater_domain::DEFAULT_DATABASE_URL.into())
}

/// `REDIS_URL`, or the local default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The same server URL with another database name.
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let server = match base.rfind('/') {
        Some(i) if base[..i].contains("//") && i > base.find("//").map_or(0, |j| j + 1) => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{server}/{db}?{q}"),
        None => format!("{server}/{db}"),
    }
}

fn host_port(url: &str) -> Option<(String, u16)> {
    let after = url.split("//").nth(1)?;
    let hostpart = after.split(['/', '?']).next()?;
    let hostport = hostpart.rsplit('@').next()?;
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().ok()?),
        None => (hostport.to_owned(), 5432),
    };
    Some((if host.is_empty() { "127.0.0.1".into() } else { host }, port))
}

fn answers(url: &str) -> bool {
    let Some((host, port)) = host_port(url) else { return false };
    let addr = format!("{host}:{port}");
    std::net::ToSocketAddrs::to_socket_addrs(&addr)
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok())
}

/// Says whether Redis answers; the API serves without it (throttles fall back in-process).
pub fn report_redis(url: &str) {
    if !answers(url) {
        eprintln!(
            "note: no Redis at {url}: throttles will run in-process. Start one with \
             `redis-server --daemonize yes` or `docker compose up -d redis`."
        );
    }
}

/// Returns a URL of a PostgreSQL that answers: the configured one, or a private throwaway
/// cluster under `target/` when PostgreSQL's binaries are installed but nothing answers.
pub async fn ensure_postgres(url: &str) -> anyhow::Result<String> {
    if answers(url) {
        return Ok(url.to_owned());
    }
    let Some(bin) = postgres_bin_dir() else {
        bail!(
            "no PostgreSQL answers at {url} and PostgreSQL is not installed.\n\
             Install it (Debian/Ubuntu: `apt-get install postgresql`), or run \
             `docker compose up -d postgres redis`, or set DATABASE_URL."
        );
    };
    let port = 54329;
    let private = format!("postgres://postgres@127.0.0.1:{port}/{}", database_name(url));
    if answers(&private) {
        return Ok(private);
    }
    let data = root().join("target").join("pgdata");
    eprintln!("no PostgreSQL at {url}: starting a private cluster in target/pgdata on port {port}");
    let cluster = Cluster { bin, data, port, as_postgres: is_root() };
    cluster.init()?;
    cluster.start()?;
    Ok(private)
}

/// A private PostgreSQL cluster: a data directory and a port, started and stopped with pg_ctl
/// (as the `postgres` user when we run as root, which PostgreSQL refuses).
#[derive(Debug)]
pub(crate) struct Cluster {
    bin: PathBuf,
    /// The data directory (also holds the Unix socket and `server.log`).
    pub(crate) data: PathBuf,
    /// The TCP port on 127.0.0.1.
    pub(crate) port: u16,
    as_postgres: bool,
}

impl Cluster {
    /// A cluster in `data` on `port`; fails when PostgreSQL's server binaries are not installed.
    pub(crate) fn new(data: PathBuf, port: u16) -> anyhow::Result<Self> {
        let bin = postgres_bin_dir().context("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")?;
        Ok(Self { bin, data, port, as_postgres: is_root() })
    }

    /// Creates the data directory unless it holds a cluster already.
    pub(crate) fn init(&self) -> anyhow::Result<()> {
        if self.data.join("PG_VERSION").exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.data)?;
        if self.as_postgres {
            run(Command::new("chown").arg("-R").arg("postgres").arg(&self.data))?;
        }
        run(pg_command(self.as_postgres, &self.bin.join("initdb"))
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(&self.data)
            .stdout(std::process::Stdio::null()))
        .context("initdb")
    }

    /// Starts the server and waits until it accepts connections.
    pub(crate) fn start(&self) -> anyhow::Result<()> {
        run(pg_command(self.as_postgres, &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .arg("-o")
            .arg(format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", self.port, self.data.display()))
            .args(["-w", "start"])
            .stdout(std::process::Stdio::null()))
        .context("pg_ctl start")
    }

    /// Stops the server (`fast`: open sessions are ended, as in a failover or a restart).
    pub(crate) fn stop(&self) -> anyhow::Result<()> {
        run(pg_command(self.as_postgres, &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .stdout(std::process::Stdio::null()))
        .context("pg_ctl stop")
    }

    /// The URL of database `db` on this cluster.
    pub(crate) fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

pub(crate) fn database_name(url: &str) -> String {
    url.split('?')
        .next()
        .and_then(|u| u.rsplit('/').next())
        .filter(|d| !d.is_empty() && !d.contains('@'))
        .unwrap_or("breakwater")
        .to_owned()
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// PostgreSQL refuses to run as root: run its tools as the `postgres` user then.
fn pg_command(as_postgres: bool, program: &Path) -> Command {
    if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn postgres_bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Some(dir);
        }
    }
    let mut versions: Vec<PathBuf> =
        std::fs::read_dir("/usr/lib/postgresql").ok()?.flatten().map(|e| e.path().join("bin")).collect();
    versions.sort();
    versions.into_iter().rev().find(|d| d.join("initdb").exists())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    anyhow::ensure!(status.success(), "{cmd:?} failed with {status}");
    Ok(())
}

/// Creates the URL's database when it does not exist.
pub async fn create_database(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let name = database_name(url);
    let mut admin = sqlx::PgConnection::connect(&with_database(url, "postgres")).await?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&name)
        .fetch_one(&mut admin)
        .await?;
    if !exists {
        sqlx::query(&format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""))).execute(&mut admin).await?;
        eprintln!("created database {name}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_the_database_name() {
        assert_eq!(with_database("postgres://u@h:5432/app", "postgres"), "postgres://u@h:5432/postgres");
        assert_eq!(with_database("postgres://u@h/app?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
        assert_eq!(host_port("postgres://u:p@db.example:6000/app"), Some(("db.example".into(), 6000)));
        assert_eq!(database_name("postgres://u@h:5432/app?x=1"), "app");
    }
}

/// A private `redis-server` on 127.0.0.1, for experiments that kill Redis (the shared one is
/// left alone). Killed when dropped.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: std::process::Child,
    port: u16,
}

impl RedisServer {
    /// Starts one on `port` (no persistence), its log in `log`; waits until it listens.
    pub(crate) fn start(port: u16, log: &Path) -> anyhow::Result<Self> {
        let log = std::fs::File::create(log)?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(log)
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("redis-server (install Redis: apt-get install redis-server)")?;
        let server = Self { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "redis-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// Its URL.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
