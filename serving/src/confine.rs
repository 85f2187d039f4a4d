//! Loads over HTTP and gRPC are confined to `[serving] model_repository`,
//! Triton-style: a model is found by name (`DIR/NAME.onnx`, a GGUF
//! `DIR/NAME.gguf`, `DIR/NAME/model.onnx`, or `DIR/NAME/` holding a
//! generative model's `genai_config.json`), and a path a caller gives is
//! relative to `DIR`.
//!
//! A path that leaves the folder lexically (absolute elsewhere, or with
//! `..`) is refused before the file system is asked anything. A path that
//! stays inside lexically is then resolved (symlinks followed); if the
//! file is missing, or resolves outside the folder, the answer is the same
//! "no model file there", so a caller learns nothing about any file
//! outside the repository, not even whether it exists.

use std::path::{Component, Path, PathBuf};

use crate::{ServeError, SetupError};

/// The model repository folder: as configured (made absolute) and with
/// symlinks resolved.
#[derive(Debug, Clone)]
pub struct ModelRepository {
    given: PathBuf,
    real: PathBuf,
}

impl ModelRepository {
    /// The folder `dir` (it must exist: checked at start).
    pub fn open(dir: &Path) -> Result<ModelRepository, SetupError> {
        let fail = |reason: String| SetupError::Repository {
            path: dir.to_path_buf(),
            reason,
        };
        let real = dir.canonicalize().map_err(|e| fail(e.to_string()))?;
        if !real.is_dir() {
            return Err(fail("not a folder".into()));
        }
        let given = std::path::absolute(dir).unwrap_or_else(|_| real.clone());
        Ok(ModelRepository { given, real })
    }

    /// The folder, symlinks resolved.
    pub fn path(&self) -> &Path {
        &self.real
    }

    /// Model `name`'s file (or generative folder) in the repository.
    pub fn find(&self, name: &str) -> Result<PathBuf, ServeError> {
        let (onnx, gguf) = (format!("{name}.onnx"), format!("{name}.gguf"));
        let folder = Path::new(name);
        for candidate in [
            Path::new(&onnx),
            Path::new(&gguf),
            &folder.join("model.onnx"),
        ] {
            if let Ok(found) = self.resolve(candidate) {
                let generative = candidate.ends_with("model.onnx")
                    && self.resolve(&folder.join("genai_config.json")).is_ok();
                return if generative {
                    self.resolve(folder)
                } else {
                    Ok(found)
                };
            }
        }
        Err(ServeError::NotFound(format!(
            "no model named '{name}' in the model repository (looked for {name}.onnx, {name}.gguf and {name}/model.onnx)"
        )))
    }

    /// A path a caller gave (relative to the repository, or absolute
    /// inside it) as the real path of a file or folder inside it.
    pub fn confine(&self, given: &Path) -> Result<PathBuf, ServeError> {
        let relative = self.lexically_inside(given).ok_or_else(|| {
            ServeError::BadRequest(format!(
                "'{}' is outside the model repository: give a path inside it, relative to it, or only the model's name",
                given.display()
            ))
        })?;
        self.resolve(&relative)
    }

    /// `given` as a path relative to the repository without `..`, if it
    /// names something inside it without asking the file system.
    fn lexically_inside(&self, given: &Path) -> Option<PathBuf> {
        let relative = if given.is_absolute() {
            given
                .strip_prefix(&self.given)
                .or_else(|_| given.strip_prefix(&self.real))
                .ok()?
        } else {
            given
        };
        let mut clean = PathBuf::new();
        for c in relative.components() {
            match c {
                Component::Normal(part) => clean.push(part),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
            }
        }
        (!clean.as_os_str().is_empty()).then_some(clean)
    }

    /// The real path of `relative` (no `..`), if it exists and stays in
    /// the repository once symlinks are followed.
    fn resolve(&self, relative: &Path) -> Result<PathBuf, ServeError> {
        let missing = || {
            ServeError::NotFound(format!(
                "no model file '{}' in the model repository",
                relative.display()
            ))
        };
        let real = self
            .real
            .join(relative)
            .canonicalize()
            .map_err(|_| missing())?;
        if real.starts_with(&self.real) {
            Ok(real)
        } else {
            Err(missing())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repository() -> (tempfile::TempDir, ModelRepository) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("repo/det")).unwrap();
        std::fs::create_dir_all(root.join("repo/llm")).unwrap();
        std::fs::write(root.join("repo/rec.onnx"), b"x").unwrap();
        std::fs::write(root.join("repo/smol.gguf"), b"GGUF").unwrap();
        std::fs::write(root.join("repo/det/model.onnx"), b"x").unwrap();
        std::fs::write(root.join("repo/llm/model.onnx"), b"x").unwrap();
        std::fs::write(root.join("repo/llm/genai_config.json"), b"{}").unwrap();
        std::fs::write(root.join("secret.onnx"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("secret.onnx"), root.join("repo/escape.onnx"))
            .unwrap();
        std::os::unix::fs::symlink(root.join("repo/rec.onnx"), root.join("repo/alias.onnx"))
            .unwrap();
        let repo = ModelRepository::open(&root.join("repo")).unwrap();
        (dir, repo)
    }

    fn not_found(r: Result<PathBuf, ServeError>) -> String {
        match r {
            Err(ServeError::NotFound(m)) => m,
            other => panic!("wanted NotFound, got {other:?}"),
        }
    }

    #[test]
    fn models_are_found_by_name_triton_style() {
        let (_d, repo) = repository();
        assert!(repo.find("rec").unwrap().ends_with("repo/rec.onnx"));
        assert!(repo.find("det").unwrap().ends_with("repo/det/model.onnx"));
        assert!(
            repo.find("llm").unwrap().ends_with("repo/llm"),
            "a generative folder"
        );
        assert!(
            repo.find("smol").unwrap().ends_with("repo/smol.gguf"),
            "a GGUF"
        );
        assert!(
            repo.find("alias").unwrap().ends_with("repo/rec.onnx"),
            "a link inside"
        );
        assert!(not_found(repo.find("nope")).contains("nope.onnx"));
        // A link to a file outside looks exactly like no file at all.
        assert_eq!(
            not_found(repo.find("escape")),
            not_found(repo.find("nope")).replace("nope", "escape")
        );
    }

    #[test]
    fn paths_leaving_the_repository_are_refused_without_a_trace_of_what_is_outside() {
        let (dir, repo) = repository();
        assert!(repo.confine(Path::new("rec.onnx")).is_ok());
        assert!(repo.confine(Path::new("./det/model.onnx")).is_ok());
        assert!(
            repo.confine(&dir.path().join("repo/rec.onnx")).is_ok(),
            "absolute inside"
        );
        for outside in [
            "../secret.onnx",
            "det/../../secret.onnx",
            "/etc/shadow",
            "/etc/no-such-file",
            "",
        ] {
            match repo.confine(Path::new(outside)) {
                Err(ServeError::BadRequest(m)) => {
                    assert!(m.contains("outside the model repository"), "{m}")
                }
                other => panic!("{outside}: {other:?}"),
            }
        }
        let absolute_secret = dir.path().join("secret.onnx");
        assert!(matches!(
            repo.confine(&absolute_secret),
            Err(ServeError::BadRequest(_))
        ));
        // Through a link: the same answer as a missing file.
        let linked = not_found(repo.confine(Path::new("escape.onnx")));
        let missing = not_found(repo.confine(Path::new("missing.onnx")));
        assert_eq!(linked.replace("escape", "missing"), missing);
    }

    #[test]
    fn a_missing_repository_fails_at_start() {
        let err = ModelRepository::open(Path::new("/nonexistent/models"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model_repository /nonexistent/models"),
            "{err}"
        );
    }
}
