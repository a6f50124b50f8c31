//! Logistic-regression models: trained with linfa, served from a small JSON
//! file (weights and intercept), so the server needs no ML library.

use std::path::Path;

use linfa::prelude::*;
use linfa_logistic::LogisticRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use crate::task::{self, BROKEN_FEATURE, FEATURES};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("training failed: {0}")]
    Train(String),
    #[error("model file {path}: {message}")]
    File { path: String, message: String },
}

/// A trained binary classifier: `P(fraud | x) = sigmoid(w·x + b)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearModel {
    pub name: String,
    pub weights: Vec<f64>,
    pub intercept: f64,
    /// Accuracy on the holdout set, measured at training time.
    pub holdout_accuracy: f64,
}

impl LinearModel {
    /// `[P(class 0), P(class 1)]` for one instance. Errors on the wrong width.
    pub fn predict_proba(&self, x: &[f64]) -> Result<[f64; 2], String> {
        if x.len() != self.weights.len() {
            return Err(format!(
                "expected {} features, got {}",
                self.weights.len(),
                x.len()
            ));
        }
        let z = self.intercept + x.iter().zip(&self.weights).map(|(a, w)| a * w).sum::<f64>();
        let p = 1.0 / (1.0 + (-z).exp());
        Ok([1.0 - p, p])
    }

    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let text = serde_json::to_string_pretty(self).map_err(|e| file_err(path, e))?;
        std::fs::write(path, text).map_err(|e| file_err(path, e))
    }

    pub fn load(path: &Path) -> Result<LinearModel, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| file_err(path, e))?;
        let m: LinearModel = serde_json::from_str(&text).map_err(|e| file_err(path, e))?;
        if m.weights.is_empty()
            || m.weights.iter().any(|w| !w.is_finite())
            || !m.intercept.is_finite()
        {
            return Err(file_err(path, "weights must be finite numbers"));
        }
        Ok(m)
    }
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::File {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Fits logistic regression with linfa. `dead` zeroes one feature in the
/// training data: the model never learns to use it.
pub fn train(
    name: &str,
    xs: &[[f64; FEATURES]],
    ys: &[bool],
    dead: Option<usize>,
) -> Result<LinearModel, ModelError> {
    let mut records = Array2::<f64>::zeros((xs.len(), FEATURES));
    for (i, x) in xs.iter().enumerate() {
        for (j, v) in x.iter().enumerate() {
            records[[i, j]] = if Some(j) == dead { 0.0 } else { *v };
        }
    }
    let targets: Array1<usize> = ys.iter().map(|&y| usize::from(y)).collect();
    let dataset = Dataset::new(records.clone(), targets);
    let fitted = LogisticRegression::default()
        .max_iterations(200)
        .fit(&dataset)
        .map_err(|e| ModelError::Train(e.to_string()))?;
    let mut model = LinearModel {
        name: name.to_string(),
        weights: fitted.params().to_vec(),
        intercept: fitted.intercept(),
        holdout_accuracy: 0.0,
    };
    // linfa orders the two labels itself; make sure P(class 1) is what our
    // sigmoid computes by checking agreement with its own predictions.
    let linfa_pred = fitted.predict(&records);
    let agree = linfa_pred
        .iter()
        .zip(xs)
        .filter(|(p, x)| {
            let ours = model
                .predict_proba(&x[..])
                .map(|q| q[1] >= 0.5)
                .unwrap_or(false);
            (**p == 1) == ours
        })
        .count();
    if agree * 2 < xs.len() {
        model.weights.iter_mut().for_each(|w| *w = -*w);
        model.intercept = -model.intercept;
    }
    Ok(model)
}

/// Share of holdout labels the model predicts.
pub fn accuracy(model: &LinearModel, xs: &[[f64; FEATURES]], ys: &[bool]) -> f64 {
    let ok = xs
        .iter()
        .zip(ys)
        .filter(|(x, y)| {
            model
                .predict_proba(&x[..])
                .is_ok_and(|p| (p[1] >= 0.5) == **y)
        })
        .count();
    ok as f64 / xs.len().max(1) as f64
}

/// How two models compare on the same inputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Agreement {
    pub agreement: f64,
    /// Decisions where `a` is at least 0.9 confident.
    pub confident: usize,
    /// Of those, how many `b` decides the other way.
    pub confident_flip_rate: f64,
}

pub fn agreement(a: &LinearModel, b: &LinearModel, xs: &[[f64; FEATURES]]) -> Agreement {
    let (mut same, mut confident, mut flips) = (0usize, 0usize, 0usize);
    for x in xs {
        let (Ok(pa), Ok(pb)) = (a.predict_proba(&x[..]), b.predict_proba(&x[..])) else {
            continue;
        };
        let agree = (pa[1] >= 0.5) == (pb[1] >= 0.5);
        same += usize::from(agree);
        if pa[0].max(pa[1]) >= 0.9 {
            confident += 1;
            flips += usize::from(!agree);
        }
    }
    Agreement {
        agreement: same as f64 / xs.len().max(1) as f64,
        confident,
        confident_flip_rate: flips as f64 / confident.max(1) as f64,
    }
}

/// One trained model of the zoo and how it compares with the champion.
#[derive(Debug, Clone, Serialize)]
pub struct ZooEntry {
    pub model: LinearModel,
    pub file: String,
    pub vs_champion: Agreement,
}

/// Trains `champion`, `retrained` (same recipe, another sample) and
/// `broken-feature` (strongest feature dead) into `out`.
pub fn train_zoo(out: &Path, seed: u64) -> Result<Vec<ZooEntry>, ModelError> {
    std::fs::create_dir_all(out).map_err(|e| file_err(out, e))?;
    let (hx, hy) = task::sample(4000, seed.wrapping_add(1_000_003));
    let recipes: [(&str, u64, Option<usize>); 3] = [
        ("champion", seed, None),
        ("retrained", seed.wrapping_add(1), None),
        ("broken-feature", seed.wrapping_add(2), Some(BROKEN_FEATURE)),
    ];
    let mut models = Vec::new();
    for (name, s, dead) in recipes {
        let (xs, ys) = task::sample(6000, s);
        let mut m = train(name, &xs, &ys, dead)?;
        m.holdout_accuracy = accuracy(&m, &hx, &hy);
        models.push(m);
    }
    let champion = models[0].clone();
    models
        .into_iter()
        .map(|m| {
            let path = out.join(format!("{}.json", m.name));
            m.save(&path)?;
            Ok(ZooEntry {
                vs_champion: agreement(&champion, &m, &hx),
                file: path.display().to_string(),
                model: m,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zoo_has_a_plausible_broken_model_that_flips_confident_decisions() {
        let dir = std::env::temp_dir().join(format!("rollgate-zoo-{}", std::process::id()));
        let zoo = train_zoo(&dir, 7).expect("train");
        let by = |n: &str| zoo.iter().find(|e| e.model.name == n).expect("entry");
        let (champ, retrained, broken) = (by("champion"), by("retrained"), by("broken-feature"));
        assert!(
            champ.model.holdout_accuracy > 0.8,
            "{}",
            champ.model.holdout_accuracy
        );
        assert!((retrained.model.holdout_accuracy - champ.model.holdout_accuracy).abs() < 0.02);
        assert!(
            retrained.vs_champion.agreement > 0.95,
            "{:?}",
            retrained.vs_champion
        );
        // Plausible accuracy, but many confident decisions flipped.
        assert!(
            broken.model.holdout_accuracy > 0.65,
            "{}",
            broken.model.holdout_accuracy
        );
        assert!(broken.model.holdout_accuracy < champ.model.holdout_accuracy - 0.05);
        assert!(
            broken.vs_champion.confident_flip_rate > 0.08,
            "{:?}",
            broken.vs_champion
        );
        let loaded = LinearModel::load(std::path::Path::new(&champ.file)).expect("load");
        assert_eq!(loaded, champ.model);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
