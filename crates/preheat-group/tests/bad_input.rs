//! Refused inputs of the communication matrix (Busse et al., SAC'15, §3, Figure 3): every
//! validation error, with messages naming the row and column.

use preheat_group::{CommMatrix, MatrixError, MAX_TASKS};

fn json_err(text: &str) -> MatrixError {
    CommMatrix::from_json_str(text).unwrap_err()
}

#[test]
fn empty() {
    assert_eq!(json_err("[]"), MatrixError::Empty);
    assert_eq!(json_err(r#"{"matrix":[]}"#), MatrixError::Empty);
    assert_eq!(CommMatrix::new(vec![]), Err(MatrixError::Empty));
    assert_eq!(
        MatrixError::Empty.to_string(),
        "matrix is empty: it needs at least one task (one row)"
    );
}

#[test]
fn too_many_tasks() {
    let n = MAX_TASKS + 1;
    let text = format!("[{}[]]", "[],".repeat(n - 1));
    let e = json_err(&text);
    assert_eq!(e, MatrixError::TooManyTasks { n });
    assert_eq!(
        e.to_string(),
        "matrix has 4097 tasks; at most 4096 are supported"
    );
}

#[test]
fn not_square() {
    let e = json_err("[[0,1,2],[1,0],[2,1,0]]");
    assert_eq!(
        e,
        MatrixError::NotSquare {
            row: 1,
            len: 2,
            n: 3
        }
    );
    assert_eq!(
        e.to_string(),
        "matrix is not square: row 1 has 2 entries, expected 3"
    );
    assert!(matches!(
        CommMatrix::new(vec![vec![0.0, 1.0]]),
        Err(MatrixError::NotSquare {
            row: 0,
            len: 2,
            n: 1
        })
    ));
    let e = json_err("[[0,1],5]");
    assert_eq!(
        e.to_string(),
        "matrix row 1 is not an array of numbers (found a number)"
    );
}

#[test]
fn not_symmetric() {
    let e = json_err("[[0,1,2],[1,0,3],[2,4,0]]");
    assert_eq!(
        e.to_string(),
        "matrix is not symmetric: entry (1,2) = 3 but (2,1) = 4"
    );
    // Within the relative tolerance of 1e-9: accepted.
    assert!(CommMatrix::new(vec![vec![0.0, 1e6], vec![1e6 + 1e-4, 0.0]]).is_ok());
    assert!(CommMatrix::new(vec![vec![0.0, 1e6], vec![1e6 + 1e-2, 0.0]]).is_err());
}

#[test]
fn negative() {
    let e = json_err("[[0,-1],[-1,0]]");
    assert_eq!(
        e,
        MatrixError::Negative {
            row: 0,
            col: 1,
            value: -1.0
        }
    );
    assert_eq!(e.to_string(), "matrix entry (0,1) is negative: -1");
    assert!(matches!(
        json_err("[[-2,1],[1,0]]"),
        MatrixError::Negative { row: 0, col: 0, .. }
    ));
}

#[test]
fn nan_and_infinite() {
    let e = CommMatrix::new(vec![vec![0.0, f64::NAN], vec![f64::NAN, 0.0]]).unwrap_err();
    assert_eq!(e.to_string(), "matrix entry (0,1) is not finite: NaN");
    let e = CommMatrix::new(vec![vec![f64::INFINITY, 1.0], vec![1.0, 0.0]]).unwrap_err();
    assert_eq!(e.to_string(), "matrix entry (0,0) is not finite: inf");
    let e = CommMatrix::new(vec![vec![0.0, 1.0], vec![f64::NEG_INFINITY, 0.0]]).unwrap_err();
    assert!(matches!(e, MatrixError::NotFinite { row: 1, col: 0, .. }));
}

#[test]
fn non_numeric() {
    let e = json_err(r#"[[0,"6"],[6,0]]"#);
    assert_eq!(
        e.to_string(),
        "matrix entry (0,1) is not a number (found a string)"
    );
    let e = json_err("[[0,1],[null,0]]");
    assert_eq!(
        e.to_string(),
        "matrix entry (1,0) is not a number (found null)"
    );
    assert!(matches!(
        json_err("[[0,[1]],[true,0]]"),
        MatrixError::NotNumeric {
            row: 0,
            col: 1,
            found: "an array"
        }
    ));
    assert!(matches!(
        json_err(r#"[[0,1],[{"a":1},0]]"#),
        MatrixError::NotNumeric {
            row: 1,
            col: 0,
            found: "an object"
        }
    ));
}

#[test]
fn wrong_json_shape() {
    for text in [
        "5",
        r#""m""#,
        "null",
        r#"{"rows":[[0]]}"#,
        r#"{"matrix":3}"#,
    ] {
        let e = json_err(text);
        assert!(matches!(e, MatrixError::Shape(_)), "{text}: {e:?}");
    }
    assert!(json_err("5")
        .to_string()
        .contains("expected an array of rows"));
    assert!(json_err("{}")
        .to_string()
        .contains("missing field `matrix`"));
    assert!(json_err(r#"{"matrix":3}"#)
        .to_string()
        .contains("\"matrix\" is a number, expected an array of rows"));
    assert!(matches!(
        json_err(r#"{"matrix":[[0]],"matrix":[[0]]}"#),
        MatrixError::Shape(_)
    ));
}

#[test]
fn invalid_json() {
    for text in ["", "[[0,1],[1,0]", "[[0,1],[1,0]] x", "[[0,NaN],[NaN,0]]"] {
        let e = json_err(text);
        assert!(matches!(e, MatrixError::Json(_)), "{text}: {e:?}");
        assert!(e.to_string().starts_with("invalid JSON: "));
    }
}
