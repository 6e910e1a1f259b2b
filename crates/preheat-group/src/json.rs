//! Reading the communication matrix of Busse et al. (SAC'15) §3, Figure 3, from JSON.
//!
//! Accepted shapes:
//!
//! * an array of rows: `[[0,6,1],[6,0,2],[1,2,0]]`;
//! * an object with a `matrix` field holding such an array. Other fields are ignored, except
//!   `labels` (an array of n strings) and `threads` (an array of n objects with `name` and/or
//!   `tid`), which name the tasks when present and of length n; `labels` wins over `threads`.
//!   A thread's label is `name/tid`, `name` or `tid`, whichever parts it has.
//!
//! Diagonal entries may be `null`. The matrix is read cell by cell into a compact form (no
//! generic JSON tree for the n² entries), so a 4096-task matrix costs little more than its
//! numbers.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::matrix::{Cell, CommMatrix, Kind, MatrixError, RowIn};

impl CommMatrix {
    /// Parse and validate a matrix from JSON text (see the [module docs](crate::json) for the
    /// accepted shapes).
    pub fn from_json_str(text: &str) -> Result<Self, MatrixError> {
        let doc: Doc = serde_json::from_str(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => MatrixError::Shape(e.to_string()),
            _ => MatrixError::Json(e.to_string()),
        })?;
        let rows = doc
            .rows
            .into_iter()
            .map(|r| match r {
                Item::Seq(cells) => Ok(cells),
                other => Err(other.kind()),
            })
            .collect::<Vec<RowIn>>();
        let m = CommMatrix::from_rows(rows)?;
        let n = m.len();
        match labels_from(doc.labels, doc.threads, n) {
            Some(labels) => m.with_labels(labels),
            None => Ok(m),
        }
    }
}

/// Task labels from a `labels` or `threads` field, if one of them fits n tasks.
fn labels_from(labels: Option<Value>, threads: Option<Value>, n: usize) -> Option<Vec<String>> {
    let given = labels.and_then(|v| match v {
        Value::Array(a) if a.len() == n => a
            .into_iter()
            .map(|l| l.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    });
    given.or_else(|| match threads? {
        Value::Array(a) if a.len() == n => Some(
            a.iter()
                .enumerate()
                .map(|(i, t)| thread_label(t).unwrap_or_else(|| i.to_string()))
                .collect(),
        ),
        _ => None,
    })
}

/// `name/tid`, `name` or `tid` of one `threads` entry.
fn thread_label(t: &Value) -> Option<String> {
    let name = t.get("name").and_then(Value::as_str);
    let tid = t.get("tid").and_then(|v| match v {
        Value::Number(x) => Some(x.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    });
    match (name, tid) {
        (Some(n), Some(t)) => Some(format!("{n}/{t}")),
        (Some(n), None) => Some(n.to_owned()),
        (None, Some(t)) => Some(t),
        (None, None) => None,
    }
}

/// The whole document: the rows and the optional label fields.
struct Doc {
    rows: Vec<Row>,
    labels: Option<Value>,
    threads: Option<Value>,
}

/// A JSON value read shallowly: numbers and null kept, arrays read as `T`s, anything else
/// reduced to its kind.
enum Item<T> {
    Num(f64),
    Null,
    Seq(Vec<T>),
    Other(Kind),
}

/// A row of entries.
type Row = Item<Cell>;

impl<T> Item<T> {
    fn kind(&self) -> &'static str {
        match self {
            Item::Num(_) => "a number",
            Item::Null => "null",
            Item::Seq(_) => Kind::Array.name(),
            Item::Other(k) => k.name(),
        }
    }
}

/// An entry is read as an item whose array contents (if any) are skipped, not stored.
impl<'de> Deserialize<'de> for Cell {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Item::<IgnoredAny>::deserialize(d)? {
            Item::Num(v) => Cell::Num(v),
            Item::Null => Cell::Null,
            Item::Seq(_) => Cell::Other(Kind::Array),
            Item::Other(k) => Cell::Other(k),
        })
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Item<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor(PhantomData))
    }
}

struct ItemVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ItemVisitor<T> {
    type Value = Item<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Item<T>, E> {
        Ok(Item::Num(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Item<T>, E> {
        Ok(Item::Num(v as f64))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Item<T>, E> {
        Ok(Item::Num(v as f64))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Item<T>, E> {
        Ok(Item::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Item<T>, E> {
        Ok(Item::Null)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Item<T>, E> {
        Ok(Item::Other(Kind::Boolean))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Item<T>, E> {
        Ok(Item::Other(Kind::String))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item<T>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(x) = seq.next_element()? {
            items.push(x);
        }
        Ok(Item::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item<T>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Item::Other(Kind::Object))
    }
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "an array of rows (like [[0,6],[6,0]]) or an object with a \"matrix\" field holding one",
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Doc, A::Error> {
        match ItemVisitor::<Row>(PhantomData).visit_seq(seq)? {
            Item::Seq(rows) => Ok(Doc {
                rows,
                labels: None,
                threads: None,
            }),
            _ => unreachable!("visit_seq yields a sequence"),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let (mut rows, mut labels, mut threads) = (None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "matrix" if rows.is_some() => return Err(de::Error::duplicate_field("matrix")),
                "matrix" => match map.next_value::<Item<Row>>()? {
                    Item::Seq(r) => rows = Some(r),
                    other => {
                        return Err(de::Error::custom(format_args!(
                            "\"matrix\" is {}, expected an array of rows",
                            other.kind()
                        )))
                    }
                },
                "labels" => labels = Some(map.next_value::<Value>()?),
                "threads" => threads = Some(map.next_value::<Value>()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let rows = rows.ok_or_else(|| de::Error::missing_field("matrix"))?;
        Ok(Doc {
            rows,
            labels,
            threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_and_null_diagonal() {
        let a = CommMatrix::from_json_str("[[null,6,1],[6,null,2],[1,2,null]]").unwrap();
        let b = CommMatrix::from_json_str(
            r#"{"version":1,"matrix":[[0,6,1],[6,0,2],[1,2,0]],"extra":{"x":[1]}}"#,
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.get(1, 2), 2.0);
    }

    #[test]
    fn labels_and_threads_name_tasks() {
        let m =
            CommMatrix::from_json_str(r#"{"matrix":[[0,1],[1,0]],"labels":["a","b"]}"#).unwrap();
        assert_eq!(m.labels(), ["a", "b"]);
        let m = CommMatrix::from_json_str(
            r#"{"matrix":[[0,1],[1,0]],"threads":[{"tid":17,"name":"w"},{"tid":18}]}"#,
        )
        .unwrap();
        assert_eq!(m.labels(), ["w/17", "18"]);
        let m = CommMatrix::from_json_str(
            r#"{"matrix":[[0,1],[1,0]],"labels":["a"],"threads":[{"name":"x"},{}]}"#,
        )
        .unwrap();
        assert_eq!(
            m.labels(),
            ["x", "1"],
            "labels of the wrong length are ignored"
        );
    }
}
