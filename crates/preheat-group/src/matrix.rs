//! The communication matrix of Busse et al. (SAC'15) §2.2/§3, Figure 3, and eq. 1.
//!
//! Cell (x, y) holds CE(x, y), the number of communication events between tasks x and y (SPCD
//! counts page faults of two threads in the same memory region). A [`CommMatrix`] is validated
//! once, on construction: square, 1 to [`MAX_TASKS`] tasks, finite, non-negative and symmetric.
//! The diagonal is ignored (stored as 0). Rows and columns are numbered from 0 in every message.

use thiserror::Error;

/// The most tasks a matrix may have (the paper expects "less than a few hundred CPUs").
pub const MAX_TASKS: usize = 4096;

/// Relative tolerance of the symmetry check: (i,j) and (j,i) may differ by this fraction of the
/// larger of the two.
pub const SYMMETRY_TOLERANCE: f64 = 1e-9;

/// Why a matrix was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MatrixError {
    /// No rows at all.
    #[error("matrix is empty: it needs at least one task (one row)")]
    Empty,
    /// More than [`MAX_TASKS`] rows.
    #[error("matrix has {n} tasks; at most {max} are supported", max = MAX_TASKS)]
    TooManyTasks {
        /// Number of rows given.
        n: usize,
    },
    /// A row that is not an array (JSON input only).
    #[error("matrix row {row} is not an array of numbers (found {found})")]
    RowNotArray {
        /// Row index.
        row: usize,
        /// What was found instead.
        found: &'static str,
    },
    /// A row whose length differs from the number of rows.
    #[error("matrix is not square: row {row} has {len} entries, expected {n}")]
    NotSquare {
        /// Row index.
        row: usize,
        /// Entries in that row.
        len: usize,
        /// Number of rows.
        n: usize,
    },
    /// An entry that is not a number (JSON input; `null` is allowed on the diagonal only).
    #[error("matrix entry ({row},{col}) is not a number (found {found})")]
    NotNumeric {
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// What was found instead.
        found: &'static str,
    },
    /// NaN or infinite.
    #[error("matrix entry ({row},{col}) is not finite: {value}")]
    NotFinite {
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// The value.
        value: f64,
    },
    /// Below zero.
    #[error("matrix entry ({row},{col}) is negative: {value}")]
    Negative {
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// The value.
        value: f64,
    },
    /// (row, col) and (col, row) differ by more than [`SYMMETRY_TOLERANCE`].
    #[error("matrix is not symmetric: entry ({row},{col}) = {a} but ({col},{row}) = {b}")]
    Asymmetric {
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// Entry (row, col).
        a: f64,
        /// Entry (col, row).
        b: f64,
    },
    /// The entries are finite but so large that their sum is not.
    #[error("matrix entries are too large: their sum is not finite")]
    Overflow,
    /// A label list whose length is not the number of tasks.
    #[error("{got} labels given for a matrix of {n} tasks")]
    LabelCount {
        /// Labels given.
        got: usize,
        /// Number of tasks.
        n: usize,
    },
    /// The input is not JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The input is JSON of the wrong shape.
    #[error("wrong JSON shape: {0}")]
    Shape(String),
}

/// One entry as given, before validation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell {
    /// A number.
    Num(f64),
    /// `null` (allowed on the diagonal).
    Null,
    /// Anything else.
    Other(Kind),
}

/// The kind of a JSON value that is not a number (kept small: a 4096-task matrix has 16 M
/// cells).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Boolean,
    String,
    Array,
    Object,
}

impl Kind {
    /// "a string", "an array", ... for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Boolean => "a boolean",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// One row as given: its cells, or what was found instead of an array.
pub(crate) type RowIn = Result<Vec<Cell>, &'static str>;

/// A validated communication matrix of n tasks (1 ≤ n ≤ [`MAX_TASKS`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CommMatrix {
    n: usize,
    /// Row-major n×n, symmetric, finite, non-negative, zero diagonal.
    ce: Vec<f64>,
    labels: Vec<String>,
}

impl CommMatrix {
    /// Validate `rows` (row i holds CE(i, 0..n)); the diagonal may hold any finite
    /// non-negative value and is ignored.
    pub fn new(rows: Vec<Vec<f64>>) -> Result<Self, MatrixError> {
        Self::from_rows(
            rows.into_iter()
                .map(|r| Ok(r.into_iter().map(Cell::Num).collect()))
                .collect(),
        )
    }

    /// [`CommMatrix::new`] of event counts (SPCD's matrices count whole events).
    pub fn from_counts(rows: &[Vec<u64>]) -> Result<Self, MatrixError> {
        Self::new(
            rows.iter()
                .map(|r| r.iter().map(|&v| v as f64).collect())
                .collect(),
        )
    }

    /// Validate rows as read from JSON: sizes first, then every entry in row-major order, then
    /// symmetry, so the first problem reported is the first one a reader would find.
    pub(crate) fn from_rows(rows: Vec<RowIn>) -> Result<Self, MatrixError> {
        let n = rows.len();
        if n == 0 {
            return Err(MatrixError::Empty);
        }
        if n > MAX_TASKS {
            return Err(MatrixError::TooManyTasks { n });
        }
        for (row, r) in rows.iter().enumerate() {
            match r {
                Err(found) => return Err(MatrixError::RowNotArray { row, found }),
                Ok(cells) if cells.len() != n => {
                    return Err(MatrixError::NotSquare {
                        row,
                        len: cells.len(),
                        n,
                    })
                }
                Ok(_) => {}
            }
        }
        let mut ce = Vec::with_capacity(n * n);
        for (row, r) in rows.into_iter().enumerate() {
            for (col, cell) in r.unwrap_or_default().into_iter().enumerate() {
                ce.push(entry(row, col, cell)?);
            }
        }
        let mut total = 0.0;
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = (ce[i * n + j], ce[j * n + i]);
                if a != b {
                    if (a - b).abs() > SYMMETRY_TOLERANCE * a.max(b) {
                        return Err(MatrixError::Asymmetric {
                            row: i,
                            col: j,
                            a,
                            b,
                        });
                    }
                    let mean = a + (b - a) / 2.0;
                    ce[i * n + j] = mean;
                    ce[j * n + i] = mean;
                }
                total += 2.0 * ce[i * n + j];
            }
        }
        if !total.is_finite() {
            return Err(MatrixError::Overflow);
        }
        let labels = (0..n).map(|i| i.to_string()).collect();
        Ok(CommMatrix { n, ce, labels })
    }

    /// The same matrix with these task labels (one per task).
    pub fn with_labels(mut self, labels: Vec<String>) -> Result<Self, MatrixError> {
        if labels.len() != self.n {
            return Err(MatrixError::LabelCount {
                got: labels.len(),
                n: self.n,
            });
        }
        self.labels = labels;
        Ok(self)
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false: a matrix has at least one task.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// CE(x, y); 0 on the diagonal.
    ///
    /// # Panics
    /// If `x` or `y` is not below [`len`](Self::len).
    pub fn get(&self, x: usize, y: usize) -> f64 {
        assert!(x < self.n && y < self.n, "task out of range");
        self.ce[x * self.n + y]
    }

    /// Task labels: from the input if it had them, else "0" … "n-1".
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The row-major n×n entries (symmetric, zero diagonal).
    pub(crate) fn entries(&self) -> &[f64] {
        &self.ce
    }

    /// Eq. 1: the dependency between task sets `x` and `y`, the sum of CE over all pairs
    /// divided by |X|·|Y|. The sets should be disjoint (a task's own entry counts as 0).
    ///
    /// # Panics
    /// If either set is empty or names a task out of range.
    pub fn dependency(&self, x: &[usize], y: &[usize]) -> f64 {
        assert!(
            !x.is_empty() && !y.is_empty(),
            "eq. 1 needs two non-empty sets"
        );
        let sum: f64 = x
            .iter()
            .flat_map(|&a| y.iter().map(move |&b| (a, b)))
            .map(|(a, b)| self.get(a, b))
            .sum();
        sum / (x.len() as f64 * y.len() as f64)
    }
}

/// Validate one entry; the diagonal becomes 0.
fn entry(row: usize, col: usize, cell: Cell) -> Result<f64, MatrixError> {
    let value = match cell {
        Cell::Null if row == col => return Ok(0.0),
        Cell::Null => {
            return Err(MatrixError::NotNumeric {
                row,
                col,
                found: "null",
            })
        }
        Cell::Other(kind) => {
            let found = kind.name();
            return Err(MatrixError::NotNumeric { row, col, found });
        }
        Cell::Num(v) => v,
    };
    if !value.is_finite() {
        return Err(MatrixError::NotFinite { row, col, value });
    }
    if value < 0.0 {
        return Err(MatrixError::Negative { row, col, value });
    }
    // abs: -0.0 passes the sign check and would print as "-0".
    Ok(if row == col { 0.0 } else { value.abs() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagonal_is_ignored_and_near_mirrors_are_averaged() {
        let m = CommMatrix::new(vec![vec![5.0, 2.0], vec![2.0 + 1e-12, 7.0]]).unwrap();
        assert_eq!(m.get(0, 0), 0.0);
        assert_eq!(m.get(1, 1), 0.0);
        assert_eq!(m.get(0, 1), m.get(1, 0));
        assert_eq!(m.labels(), ["0", "1"]);
    }

    #[test]
    fn eq1_averages_over_pairs() {
        let m = CommMatrix::new(vec![
            vec![0.0, 6.0, 1.0],
            vec![6.0, 0.0, 2.0],
            vec![1.0, 2.0, 0.0],
        ])
        .unwrap();
        assert_eq!(m.dependency(&[0, 1], &[2]), 1.5);
        assert_eq!(m.dependency(&[0], &[1]), 6.0);
    }

    #[test]
    fn overflowing_sum_is_refused() {
        let big = f64::MAX;
        let r = CommMatrix::new(vec![
            vec![0.0, big, big],
            vec![big, 0.0, big],
            vec![big, big, 0.0],
        ]);
        assert_eq!(r, Err(MatrixError::Overflow));
    }

    #[test]
    fn labels_must_match_the_task_count() {
        let m = CommMatrix::new(vec![vec![0.0]]).unwrap();
        assert!(m.clone().with_labels(vec!["a".into()]).is_ok());
        let e = m.with_labels(vec![]).unwrap_err();
        assert_eq!(e.to_string(), "0 labels given for a matrix of 1 tasks");
    }
}
