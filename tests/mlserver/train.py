"""Trains the tiny scikit-learn models the MLServer e2e tests serve.

champion   logistic regression on 4 features
retrained  the same model class on a fresh sample: agrees on nearly all rows
broken     trained with feature 0 sign-flipped (a broken feature pipeline):
           disagrees with the champion on many confident rows

Usage: train.py MODELS_DIR   (writes MODELS_DIR/<name>/{model.joblib,model-settings.json})
"""
import json
import os
import sys

import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression


def sample(seed, n=4000):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    logits = 2.5 * x[:, 0] - 1.5 * x[:, 1] + 0.5 * x[:, 2]
    y = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(int)
    return x, y


def save(root, name, model):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    joblib.dump(model, os.path.join(d, "model.joblib"))
    with open(os.path.join(d, "model-settings.json"), "w") as f:
        json.dump({"name": name, "implementation": "mlserver_sklearn.SKLearnModel",
                   "parameters": {"uri": "./model.joblib", "version": "v1"}}, f)


def main():
    root = sys.argv[1]
    x, y = sample(0)
    save(root, "champion", LogisticRegression().fit(x, y))
    x2, y2 = sample(1)
    save(root, "retrained", LogisticRegression().fit(x2, y2))
    xb = x.copy()
    xb[:, 0] = -xb[:, 0]
    save(root, "broken", LogisticRegression().fit(xb, y))


if __name__ == "__main__":
    main()
