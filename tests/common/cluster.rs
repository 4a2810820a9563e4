//! A PostgreSQL cluster of a test's own, for tests that crash, stop or restore it; and the
//! primary/standby pair of `services.sh pg-ha-start`.

use super::{env, random_name, services};

/// `url` with its database replaced by `db`.
pub fn with_db(url: &str, db: &str) -> String {
    format!("{}/{db}", url.rsplit_once('/').unwrap().0)
}

/// Runs `sql` on `url` (a fresh connection); the first column of the first row, as text.
pub async fn query_text(url: &str, sql: &str) -> Option<String> {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(conn);
    let rows = c.simple_query(sql).await.ok()?;
    rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

/// The pg-ha pair's superuser URLs after a fresh `pg-ha-reset` + `pg-ha-start` with `extra`
/// in its environment (e.g. `OUTBOX_PG_HA_SLOT_SYNC`).
pub struct HaPair {
    pub primary: String,
    pub standby: String,
}

impl HaPair {
    pub fn fresh(extra: &[(&str, &str)]) -> HaPair {
        services("pg-ha-reset");
        let out = std::process::Command::new("bash")
            .arg(env("OUTBOX_TEST_SERVICES"))
            .arg("pg-ha-start")
            .envs(extra.iter().copied())
            .output()
            .expect("run services.sh pg-ha-start");
        assert!(
            out.status.success(),
            "pg-ha-start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env_file = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let text = std::fs::read_to_string(&env_file).expect("read the env file");
        let var = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('\'').to_string())
                .unwrap_or_else(|| panic!("{name} not in {env_file}"))
        };
        HaPair {
            primary: var("OUTBOX_TEST_PG_HA_PRIMARY_URL"),
            standby: var("OUTBOX_TEST_PG_HA_STANDBY_URL"),
        }
    }
}

/// A PostgreSQL cluster of the test's own (wal_level = logical), made with the server binaries
/// of this run (`OUTBOX_TEST_PG_SERVER_BIN`) under the run dir, on a port of its own: a test
/// that stops it and swaps its data directory disturbs nobody. Stopped and deleted on drop.
pub struct OwnCluster {
    dir: std::path::PathBuf,
    port: u16,
}

impl OwnCluster {
    pub fn new(name: &str) -> OwnCluster {
        let run = std::env::var("OUTBOX_RUN_DIR").unwrap_or_else(|_| "/tmp".into());
        let dir = std::path::PathBuf::from(run).join(random_name(name));
        std::fs::create_dir_all(&dir).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cluster = OwnCluster { dir, port };
        if is_root() {
            run_ok(
                std::process::Command::new("chown")
                    .arg("postgres:")
                    .arg(&cluster.dir),
            );
        }
        cluster.as_pg(&[
            "initdb",
            "-D",
            &cluster.data(),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "-N",
        ]);
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\n\
             wal_sender_timeout = '10s'\nfsync = off\nshared_buffers = 32MB\n",
            cluster.port,
            cluster.dir.display()
        );
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(cluster.dir.join("data/postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(&mut file, conf.as_bytes()).unwrap();
        cluster.start();
        cluster
    }

    pub fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs a server binary as the cluster's owner (`postgres` when the tests run as root).
    fn as_pg(&self, args: &[&str]) {
        let bin = std::path::PathBuf::from(env("OUTBOX_TEST_PG_SERVER_BIN")).join(args[0]);
        let mut command = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            std::process::Command::new(bin)
        };
        run_ok(command.args(&args[1..]));
    }

    pub fn start(&self) {
        let log = self.dir.join("postgres.log").display().to_string();
        self.as_pg(&[
            "pg_ctl",
            "-D",
            &self.data(),
            "-l",
            &log,
            "-w",
            "-t",
            "60",
            "-s",
            "start",
        ]);
    }

    /// A clean shutdown: everything flushed, a shutdown checkpoint written.
    pub fn stop(&self) {
        self.as_pg(&[
            "pg_ctl",
            "-D",
            &self.data(),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "-s",
            "stop",
        ]);
    }

    /// A crash: `pg_ctl -m immediate` (no shutdown checkpoint, so slots fall back to their
    /// last saved positions), then a start, which recovers from the WAL.
    pub fn crash(&self) {
        self.as_pg(&[
            "pg_ctl",
            "-D",
            &self.data(),
            "-m",
            "immediate",
            "-w",
            "-s",
            "stop",
        ]);
        self.start();
    }

    /// `cp -a` of the (stopped) data directory to `to` beside it: owner and modes kept.
    pub fn copy_data(&self, to: &str) {
        run_ok(
            std::process::Command::new("cp")
                .arg("-a")
                .arg(self.data())
                .arg(self.dir.join(to)),
        );
    }

    /// Puts the copy `from` in place of the (stopped) data directory, keeping that as `keep`.
    pub fn restore_data(&self, from: &str, keep: &str) {
        std::fs::rename(self.data(), self.dir.join(keep)).unwrap();
        std::fs::rename(self.dir.join(from), self.data()).unwrap();
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let bin = std::path::PathBuf::from(env("OUTBOX_TEST_PG_SERVER_BIN")).join("pg_ctl");
        let mut command = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            std::process::Command::new(bin)
        };
        let _ = command
            .args(["-D", &self.data(), "-m", "immediate", "-w", "-s", "stop"])
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the tests run as root (then PostgreSQL runs as `postgres`): who owns this process.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn run_ok(command: &mut std::process::Command) {
    let out = command.output().expect("run a PostgreSQL tool");
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
