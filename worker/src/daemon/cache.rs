//! Compiled subgraphs cached on disk, by device and model hash, through the
//! plugins' export/import: a re-deploy of the same subgraph is a file read.
//! Cache errors are logged and never fail a deployment.

use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub fn new(dir: PathBuf) -> CompileCache {
        CompileCache { dir }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        // Keys are `DEVICE-<sha256 hex>`; anything else is not a file name.
        let ok = !key.is_empty()
            && key.len() <= 128
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            && !key.starts_with('.');
        ok.then(|| self.dir.join(format!("{key}.blob")))
    }

    pub fn get(&self, key: &str) -> Option<bytes::Bytes> {
        std::fs::read(self.path(key)?).ok().map(bytes::Bytes::from)
    }

    /// Writes the blob made of `pieces`, one after another.
    pub fn put(&self, key: &str, pieces: &[bytes::Bytes]) {
        let Some(path) = self.path(key) else {
            tracing::warn!("not caching under the key '{key}'");
            return;
        };
        // Write then rename: a reader never sees half a blob.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| write_pieces(&tmp, pieces))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!("cannot cache {}: {e}", path.display());
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn write_pieces(path: &std::path::Path, pieces: &[bytes::Bytes]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for piece in pieces {
        file.write_all(piece)?;
    }
    file.flush()
}
