//! Per-request records: the sink trait, the CSV file, and the writer thread that takes records
//! from the measuring threads through a channel (so they never wait for I/O).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::Record;

/// Where records go. Implementations must not block the measuring threads for long: the engine
/// hands records over through a channel to a writer thread.
pub trait RecordSink: Send {
    fn write(&mut self, r: &Record) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
}

/// The CSV header of [`CsvSink`]: every [`Record`] field, in declaration order.
pub const CSV_HEADER: &str = "seq,conn,mode,gap_us,intended_ns,granted_ns,sent_ns,done_ns,latency_us,kind,ok,scheduled,strategy";

/// Records as CSV (header first); flushed at least every 100 ms so an interrupted run keeps
/// what it measured.
pub struct CsvSink {
    w: BufWriter<File>,
    path: PathBuf,
    last_flush: Instant,
}

impl CsvSink {
    pub fn create(path: &Path) -> Result<CsvSink> {
        let f = File::create(path)
            .with_context(|| format!("creating the records file {}", path.display()))?;
        let mut s = CsvSink {
            w: BufWriter::new(f),
            path: path.to_path_buf(),
            last_flush: Instant::now(),
        };
        writeln!(s.w, "{CSV_HEADER}")
            .and_then(|_| s.w.flush())
            .with_context(|| format!("writing {}", s.path.display()))?;
        Ok(s)
    }
}

/// A CSV field: quoted when it contains a separator, quote or line break.
fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

impl RecordSink for CsvSink {
    fn write(&mut self, r: &Record) -> Result<()> {
        writeln!(
            self.w,
            "{},{},{},{:.3},{},{},{},{},{:.3},{},{},{},{}",
            r.seq,
            r.conn,
            r.mode.name(),
            r.gap_us,
            r.intended_ns,
            r.granted_ns,
            r.sent_ns,
            r.done_ns,
            r.latency_us,
            csv_field(r.kind),
            r.ok,
            r.scheduled,
            csv_field(&r.strategy)
        )
        .with_context(|| format!("writing {}", self.path.display()))?;
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.last_flush = Instant::now();
        self.w
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The writer flushes at least this often.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// The writer thread: records to the sink, flushed at least every 100 ms and at the end. After
/// a write error it keeps draining the channel (the run goes on) and reports the error at the
/// end.
pub(super) fn write_records(
    mut sink: Box<dyn RecordSink>,
    rx: mpsc::Receiver<Record>,
) -> Result<()> {
    let mut err: Option<anyhow::Error> = None;
    let mut dirty = false;
    let mut last_flush = Instant::now();
    loop {
        let timeout = FLUSH_EVERY
            .saturating_sub(last_flush.elapsed())
            .max(Duration::from_millis(1));
        match rx.recv_timeout(timeout) {
            Ok(r) => {
                if err.is_none() {
                    match sink.write(&r) {
                        Ok(()) => dirty = true,
                        Err(e) => err = Some(e),
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if last_flush.elapsed() >= FLUSH_EVERY {
            if dirty && err.is_none() {
                if let Err(e) = sink.flush() {
                    err = Some(e);
                }
                dirty = false;
            }
            last_flush = Instant::now();
        }
    }
    if err.is_none() {
        if let Err(e) = sink.flush() {
            err = Some(e);
        }
    }
    match err {
        Some(e) => Err(e.context("writing the per-request records")),
        None => Ok(()),
    }
}
