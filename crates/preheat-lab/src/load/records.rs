//! Per-request records: the sink trait, the CSV file, and the writer thread that takes records
//! from the measuring threads through a channel (so they never wait for I/O).

use std::fs::File;
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

/// The CSV header of [`CsvSink`]: every [`Record`] field, in declaration order (taken from the
/// record's serde field names, not kept by hand).
pub fn csv_header() -> &'static str {
    static HEADER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HEADER.get_or_init(|| {
        let mut w = csv::Writer::from_writer(Vec::new());
        // A record only to learn the field names; serializing it cannot fail.
        let _ = w.serialize(Record {
            seq: 0,
            conn: 0,
            mode: super::Mode::Closed,
            gap_us: 0.0,
            intended_ns: 0,
            granted_ns: 0,
            sent_ns: 0,
            done_ns: 0,
            latency_us: 0.0,
            kind: "",
            ok: false,
            scheduled: false,
            strategy: String::new(),
        });
        let bytes = w.into_inner().unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        text.lines().next().unwrap_or_default().to_string()
    })
}

/// Records as CSV (`csv` + serde; header first, also for a run that measured nothing);
/// flushed at least every 100 ms so an interrupted run keeps what it measured.
pub struct CsvSink {
    w: csv::Writer<File>,
    path: PathBuf,
    last_flush: Instant,
}

impl CsvSink {
    pub fn create(path: &Path) -> Result<CsvSink> {
        let f = File::create(path)
            .with_context(|| format!("creating the records file {}", path.display()))?;
        let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(f);
        w.write_record(csv_header().split(','))
            .and_then(|_| w.flush().map_err(csv::Error::from))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(CsvSink {
            w,
            path: path.to_path_buf(),
            last_flush: Instant::now(),
        })
    }
}

impl RecordSink for CsvSink {
    fn write(&mut self, r: &Record) -> Result<()> {
        self.w
            .serialize(r)
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
