//! The runner's long-term identity key (`docs/protocol.md` §4): made on the
//! first start, kept in the state folder and read back on every later one,
//! so clients can pin its public key. It signs each encrypted session's
//! handshake; `GET /v1/identity` answers its public key.
//!
//! Files: `identity.key` (the secret scalar, base64url, mode 0600) and
//! `identity.pub` (the public key, base64url of the uncompressed point,
//! for an operator to hand to clients).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use asbx_crypto::IdentityKey;

use crate::error::RunnerError;

/// The secret key's file in the state folder.
pub(crate) const SECRET_FILE: &str = "identity.key";
/// The public key's file in the state folder.
pub(crate) const PUBLIC_FILE: &str = "identity.pub";

/// The identity kept in `dir`, made (and written) when there is none.
pub(crate) fn load_or_create(dir: &Path) -> Result<IdentityKey, RunnerError> {
    let path = dir.join(SECRET_FILE);
    let key = match std::fs::read_to_string(&path) {
        Ok(text) => IdentityKey::from_secret(&text).map_err(|e| {
            RunnerError::io(
                path.display(),
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(&path)?,
        Err(e) => return Err(RunnerError::io(path.display(), e)),
    };
    let public = dir.join(PUBLIC_FILE);
    std::fs::write(&public, format!("{}\n", key.public_key()))
        .map_err(|e| RunnerError::io(public.display(), e))?;
    Ok(key)
}

/// Makes a key and writes it, readable by the owner only; another runner
/// on the same folder that wrote first wins.
fn create(path: &Path) -> Result<IdentityKey, RunnerError> {
    let key = IdentityKey::generate();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match file {
        Ok(mut f) => {
            f.write_all(format!("{}\n", key.secret()).as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| RunnerError::io(path.display(), e))?;
            tracing::info!(public_key = %key.public_key(), "made the runner's identity key");
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text =
                std::fs::read_to_string(path).map_err(|e| RunnerError::io(path.display(), e))?;
            IdentityKey::from_secret(&text).map_err(|e| {
                RunnerError::io(
                    path.display(),
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                )
            })
        }
        Err(e) => Err(RunnerError::io(path.display(), e)),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_key_is_made_once_owner_only_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let meta = std::fs::metadata(dir.path().join(SECRET_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let again = load_or_create(dir.path()).unwrap();
        assert_eq!(again.public_key(), first.public_key());
        let public = std::fs::read_to_string(dir.path().join(PUBLIC_FILE)).unwrap();
        assert_eq!(public.trim(), first.public_key());
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            load_or_create(other.path()).unwrap().public_key(),
            first.public_key()
        );
    }

    #[test]
    fn a_damaged_key_file_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SECRET_FILE), "not a key").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains(SECRET_FILE), "{err}");
    }
}
