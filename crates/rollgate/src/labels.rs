//! `rollgate labels send MODEL FILE`: ground truth from a file (JSON
//! lines or CSV) to `POST /api/v1/models/{model}/labels`, in batches. The
//! whole file is read and checked first: a line that is not a label stops
//! the command (exit 2, naming the line) before anything is sent. Each
//! batch is applied whole by the API; what became of the labels is summed.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::cli::{Global, api, finish, print};
use crate::client::CallError;

#[derive(Subcommand, Debug)]
pub enum LabelsCmd {
    /// Send labels for a model's answers, named by their request ids.
    Send {
        /// The model.
        model: String,
        /// JSON lines (`{"request_id": "…", "label": …, "observed_at": MS}`
        /// a line) or CSV with a header naming `request_id`, `label` and
        /// optionally `observed_at`; `-` reads standard input.
        file: PathBuf,
        /// The file's format: by its extension (`.csv`, else JSON lines)
        /// unless given.
        #[arg(long, value_enum)]
        format: Option<Format>,
        /// Labels per request to the API (at most 10,000).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        batch: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Jsonl,
    Csv,
}

/// Runs a `labels` command.
pub fn labels(g: &Global, cmd: &LabelsCmd) -> anyhow::Result<ExitCode> {
    let LabelsCmd::Send {
        model,
        file,
        format,
        batch,
    } = cmd;
    let format = format.unwrap_or_else(|| format_of(file));
    let text = match read(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rollgate: {}: {e}", file.display());
            return Ok(ExitCode::from(2));
        }
    };
    let entries = match parse(&text, format) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("rollgate: {}: {e}", file.display());
            return Ok(ExitCode::from(2));
        }
    };
    let a = api(g)?;
    let path = format!("/api/v1/models/{model}/labels");
    Ok(finish((|| {
        let mut total =
            json!({"received": 0, "applied": 0, "duplicates": 0, "conflicts": 0, "unknown": 0});
        for chunk in batches(&entries, usize::try_from(*batch).unwrap_or(1000)) {
            let counts = a.call("POST", &path, Some(&json!({ "labels": chunk })))?;
            for k in ["received", "applied", "duplicates", "conflicts", "unknown"] {
                let sum = total[k].as_u64().unwrap_or(0) + counts[k].as_u64().unwrap_or(0);
                total[k] = json!(sum);
            }
        }
        print(g, &total, |t| {
            println!(
                "{} labels sent: {} applied, {} duplicates, {} conflicts (not applied), {} unknown ids",
                t["received"], t["applied"], t["duplicates"], t["conflicts"], t["unknown"]
            )
        });
        Ok::<_, CallError>(ExitCode::SUCCESS)
    })()))
}

fn format_of(file: &Path) -> Format {
    match file.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv,
        _ => Format::Jsonl,
    }
}

fn read(file: &Path) -> std::io::Result<String> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        Ok(s)
    } else {
        std::fs::read_to_string(file)
    }
}

/// Every label in `text`, or the first line that is not one.
fn parse(text: &str, format: Format) -> Result<Vec<Value>, String> {
    // A spreadsheet's byte-order mark is not part of the first field.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match format {
        Format::Jsonl => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                let v: Value =
                    serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1))?;
                checked(v).map_err(|e| format!("line {}: {e}", i + 1))
            })
            .collect(),
        Format::Csv => parse_csv(text),
    }
}

/// A CSV file of labels: its header names the columns.
fn parse_csv(text: &str) -> Result<Vec<Value>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let header = reader.headers().map_err(|e| e.to_string())?.clone();
    let col = |name: &str| header.iter().position(|h| h == name);
    let (Some(id), Some(label)) = (col("request_id"), col("label")) else {
        return Err("the header must name request_id and label".into());
    };
    let observed = col("observed_at");
    reader
        .records()
        .map(|r| {
            let r = r.map_err(|e| e.to_string())?;
            let line = r.position().map_or(0, csv::Position::line);
            let at = |i: usize| r.get(i).unwrap_or("");
            let mut v = json!({"request_id": at(id), "label": at(label)});
            if let Some(o) = observed.filter(|&o| !at(o).is_empty()) {
                let ms: u64 = at(o)
                    .parse()
                    .map_err(|_| format!("line {line}: observed_at: expected milliseconds"))?;
                v["observed_at"] = json!(ms);
            }
            checked(v).map_err(|e| format!("line {line}: {e}"))
        })
        .collect()
}

/// A label entry as the API takes it (the API's own rules, checked here
/// first so that a bad line stops the command before anything is sent):
/// an object of `request_id` (1-128 characters, no control characters),
/// `label` (a string of 1-128 characters, a number or a boolean) and
/// optionally `observed_at` (milliseconds).
fn checked(v: Value) -> Result<Value, String> {
    const MAX: usize = rollgate_store::MAX_LABEL_TEXT;
    let obj = v.as_object().ok_or("expected an object")?;
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "request_id" | "label" | "observed_at"))
    {
        return Err(format!("unknown field {k:?}"));
    }
    match obj.get("request_id") {
        Some(Value::String(s))
            if !s.is_empty() && s.len() <= MAX && !s.chars().any(char::is_control) => {}
        _ => {
            return Err(format!(
                "request_id: expected the request's id, 1-{MAX} characters"
            ));
        }
    }
    match obj.get("label") {
        Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= MAX => {}
        Some(Value::Number(_) | Value::Bool(_)) => {}
        _ => {
            return Err(format!(
                "label: expected a string (1-{MAX} characters), a number or a boolean"
            ));
        }
    }
    match obj.get("observed_at") {
        None | Some(Value::Null) => {}
        Some(o) if o.as_u64().is_some() => {}
        Some(_) => return Err("observed_at: expected milliseconds since the Unix epoch".into()),
    }
    Ok(v)
}

/// The entries in batches of at most `max` labels and about 1 MiB (the
/// API reads 2 MiB at most).
fn batches(entries: &[Value], max: usize) -> Vec<&[Value]> {
    const BYTES: usize = 1 << 20;
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, e) in entries.iter().enumerate() {
        let size = e.to_string().len() + 1;
        if i > start && (i - start >= max || bytes + size > BYTES) {
            out.push(&entries[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_and_csv_read_alike_and_a_bad_line_is_named() {
        let jsonl = "{\"request_id\": \"a\", \"label\": 1}\n\n{\"request_id\": \"b\", \"label\": \"fraud\", \"observed_at\": 5}\n";
        let csv = "request_id,label,observed_at\na,1,\n\"b\",fraud,5\n";
        let j = parse(jsonl, Format::Jsonl).expect("jsonl");
        let c = parse(csv, Format::Csv).expect("csv");
        assert_eq!(j.len(), 2);
        assert_eq!(c.len(), 2);
        assert_eq!(j[1]["observed_at"], 5);
        assert_eq!(c[1]["observed_at"], 5);
        assert_eq!(c[1]["request_id"], "b");
        let e = parse(
            "{\"request_id\": \"a\", \"label\": 1}\n{\"label\": 1}\n",
            Format::Jsonl,
        )
        .expect_err("no id");
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse("request_id,label\na,1\nb\n", Format::Csv).expect_err("short row");
        assert!(e.contains("line 3") || e.contains("record 2"), "{e}");
        assert!(parse("id,truth\na,1\n", Format::Csv).is_err());
        assert!(parse("{\"request_id\": \"a\", \"label\": \"\"}\n", Format::Jsonl).is_err());
        assert!(
            parse(
                "{\"request_id\": \"a\", \"label\": 1, \"x\": 2}\n",
                Format::Jsonl
            )
            .is_err()
        );
        let many: Vec<Value> = (0..2500)
            .map(|i| json!({"request_id": format!("r{i}"), "label": 1}))
            .collect();
        let sizes: Vec<usize> = batches(&many, 1000).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        let bom = parse("\u{feff}request_id,label\na,1\n", Format::Csv).expect("a BOM");
        assert_eq!(bom[0]["request_id"], "a");
        assert_eq!(format_of(Path::new("x.CSV")), Format::Csv);
        assert_eq!(format_of(Path::new("x.jsonl")), Format::Jsonl);
    }
}
