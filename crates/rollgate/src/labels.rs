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
        for chunk in entries.chunks(usize::try_from(*batch).unwrap_or(1000)) {
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

/// A label entry as the API takes it: an object with a request id and a
/// label (the API checks the rest).
fn checked(v: Value) -> Result<Value, String> {
    let ok = v
        .get("request_id")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
        && v.get("label").is_some_and(|l| !l.is_null());
    if ok {
        Ok(v)
    } else {
        Err("expected an object with request_id and label".into())
    }
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
        assert_eq!(format_of(Path::new("x.CSV")), Format::Csv);
        assert_eq!(format_of(Path::new("x.jsonl")), Format::Jsonl);
    }
}
