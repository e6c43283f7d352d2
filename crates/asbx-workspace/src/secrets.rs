//! Secret values at rest (docs/secrets.md): named environments' secrets and
//! stdio MCP servers' `env` values are stored sealed, never in clear.
//!
//! A sealed value is `asbx-sealed:v1:{key id}:{base64(nonce ‖ ciphertext)}`:
//! AES-256-GCM under the workspace's secret key, a random 96-bit nonce per
//! value. The key comes from `ASBX_SECRET_KEY` (base64 of 32 bytes) or, on
//! SQLite without it, from `{data_dir}/secret.key`, made `0600` on first
//! start. On PostgreSQL the key is required: nodes sharing the database
//! must share it, and a node that made its own would seal values the others
//! can't read, so a node without it refuses to start.
//!
//! Rotation: values name the key that sealed them (its id, a hash of it),
//! so a node started with a new `ASBX_SECRET_KEY` and the previous one in
//! `ASBX_SECRET_KEY_OLD` reads both and reseals, at start, every value not
//! under the new key. A value without the prefix is clear text stored before
//! sealing existed: it is read as it is and sealed at the next start.
//!
//! Stdio MCP `env` values are write-only like environment secrets: answers
//! show each as [`MASK`], and a body that sends [`MASK`] back for a name
//! keeps the stored value ([`Sealer::seal_servers`]).

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use asbx_protocol::FieldError;
use asbx_protocol::callback::McpServer;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sha2::{Digest, Sha256};

use crate::error::WorkspaceError;

/// What every sealed value starts with (the format's version included).
const PREFIX: &str = "asbx-sealed:v1:";

/// How a stored stdio MCP `env` value is answered; sent back, it keeps the
/// stored value.
pub(crate) const MASK: &str = "********";

/// The key file's name under the data folder.
pub(crate) const KEY_FILE: &str = "secret.key";

const NONCE_LEN: usize = 12;

/// One secret key and its id.
#[derive(Clone)]
struct SecretKey {
    id: String,
    cipher: Aes256Gcm,
}

impl SecretKey {
    /// From base64 of 32 bytes (`what` names its setting in errors).
    fn parse(text: &str, what: &str) -> Result<SecretKey, WorkspaceError> {
        let bytes = B64.decode(text.trim()).map_err(|_| {
            WorkspaceError::Config(format!("{what} is not base64 (of 32 random bytes)"))
        })?;
        if bytes.len() != 32 {
            return Err(WorkspaceError::Config(format!(
                "{what} must be base64 of 32 bytes, not of {}",
                bytes.len()
            )));
        }
        let mut h = Sha256::new();
        h.update(b"asbx secret key id\0");
        h.update(&bytes);
        let id = hex::encode(&h.finalize()[..4]);
        let cipher = Aes256Gcm::new_from_slice(&bytes)
            .map_err(|_| WorkspaceError::Config(format!("{what}: not an AES-256 key")))?;
        Ok(SecretKey { id, cipher })
    }
}

/// Seals and opens secret values (see the module doc). `Debug` shows the
/// key ids only.
#[derive(Clone)]
pub(crate) struct Sealer {
    current: SecretKey,
    old: Option<SecretKey>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("key_id", &self.current.id)
            .field("old_key_id", &self.old.as_ref().map(|k| &k.id))
            .finish()
    }
}

impl Sealer {
    /// The sealer of a workspace: `key` (`ASBX_SECRET_KEY`), else the key
    /// file under `data_dir` (made when missing) unless `key_required`
    /// (PostgreSQL); `old` (`ASBX_SECRET_KEY_OLD`) is read for opening.
    pub(crate) fn load(
        key: Option<&str>,
        old: Option<&str>,
        data_dir: &Path,
        key_required: bool,
    ) -> Result<Sealer, WorkspaceError> {
        let current = match key.filter(|k| !k.trim().is_empty()) {
            Some(k) => SecretKey::parse(k, "ASBX_SECRET_KEY")?,
            None if key_required => {
                return Err(WorkspaceError::Config(
                    "ASBX_SECRET_KEY is required on PostgreSQL: every node sharing the database \
                     must seal secrets with the same key (make one with \
                     `head -c 32 /dev/urandom | base64`)"
                        .to_owned(),
                ));
            }
            None => SecretKey::parse(&key_file(data_dir)?, "the key file")?,
        };
        let old = old
            .filter(|k| !k.trim().is_empty())
            .map(|k| SecretKey::parse(k, "ASBX_SECRET_KEY_OLD"))
            .transpose()?;
        Ok(Sealer { current, old })
    }

    /// A sealer with a random key (tests).
    #[cfg(test)]
    pub(crate) fn random() -> Sealer {
        let key = B64.encode(rand::random::<[u8; 32]>());
        Sealer {
            current: SecretKey::parse(&key, "key").unwrap_or_else(|_| unreachable!()),
            old: None,
        }
    }

    /// `plain` sealed under the current key.
    pub(crate) fn seal(&self, plain: &str) -> String {
        let nonce: [u8; NONCE_LEN] = rand::random();
        // Encrypting a slice in memory fails only past GCM's 64 GiB limit.
        let sealed = self
            .current
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plain.as_bytes())
            .unwrap_or_default();
        let mut raw = nonce.to_vec();
        raw.extend_from_slice(&sealed);
        format!("{PREFIX}{}:{}", self.current.id, B64.encode(raw))
    }

    /// The clear text of a stored value: opened when sealed, as it is when
    /// it is clear text from before sealing existed.
    pub(crate) fn open(&self, stored: &str) -> Result<String, WorkspaceError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_owned());
        };
        let (id, body) = rest
            .split_once(':')
            .ok_or_else(|| WorkspaceError::Corrupt("a sealed value without a key id".to_owned()))?;
        let key = [Some(&self.current), self.old.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.id == id)
            .ok_or_else(|| {
                WorkspaceError::Corrupt(format!(
                    "a secret sealed under key {id}, which is neither ASBX_SECRET_KEY ({}) \
                     nor ASBX_SECRET_KEY_OLD",
                    self.current.id
                ))
            })?;
        let raw = B64
            .decode(body)
            .map_err(|_| WorkspaceError::Corrupt("a sealed value is not base64".to_owned()))?;
        if raw.len() < NONCE_LEN {
            return Err(WorkspaceError::Corrupt(
                "a sealed value is too short".to_owned(),
            ));
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let plain = key
            .cipher
            .decrypt(Nonce::from_slice(nonce), sealed)
            .map_err(|_| {
                WorkspaceError::Corrupt(format!("a value sealed under key {id} does not open"))
            })?;
        String::from_utf8(plain)
            .map_err(|_| WorkspaceError::Corrupt("a sealed value is not UTF-8".to_owned()))
    }

    /// `stored` sealed under the current key, or `None` when it already is.
    pub(crate) fn reseal(&self, stored: &str) -> Result<Option<String>, WorkspaceError> {
        let current = format!("{PREFIX}{}:", self.current.id);
        if stored.starts_with(&current) {
            return Ok(None);
        }
        Ok(Some(self.seal(&self.open(stored)?)))
    }

    /// Seals the `env` values of the stdio servers of a body; a value that
    /// is [`MASK`] keeps the one `stored` holds for the same server and
    /// name (a field error under `field` when there is none).
    pub(crate) fn seal_servers(
        &self,
        servers: &mut [McpServer],
        stored: &[McpServer],
        field: &str,
    ) -> Vec<FieldError> {
        let mut errors = Vec::new();
        for (i, server) in servers.iter_mut().enumerate() {
            let McpServer::Stdio { name, env, .. } = server else {
                continue;
            };
            let kept = stored.iter().find_map(|s| match s {
                McpServer::Stdio { name: n, env, .. } if n == name => Some(env),
                McpServer::Stdio { .. } | McpServer::Http { .. } => None,
            });
            for (key, value) in env.iter_mut() {
                if value != MASK {
                    *value = self.seal(value);
                    continue;
                }
                match kept.and_then(|e| e.get(key)) {
                    Some(old) => value.clone_from(old),
                    None => errors.push(FieldError::new(
                        &format!("{field}[{i}].env.{key}"),
                        "is the mask of a stored value, but none is stored for this server \
                         and name: send the value",
                    )),
                }
            }
        }
        errors
    }

    /// Opens the `env` values of the stdio servers (for `/config`).
    pub(crate) fn open_servers(&self, servers: &mut [McpServer]) -> Result<(), WorkspaceError> {
        for value in stdio_env_values(servers) {
            *value = self.open(value)?;
        }
        Ok(())
    }

    /// Reseals the `env` values not under the current key; whether any was.
    pub(crate) fn reseal_servers(&self, servers: &mut [McpServer]) -> Result<bool, WorkspaceError> {
        let mut changed = false;
        for value in stdio_env_values(servers) {
            if let Some(v) = self.reseal(value)? {
                *value = v;
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// Every stdio server's `env` value replaced by [`MASK`] (for answers).
pub(crate) fn mask_servers(servers: &mut [McpServer]) {
    for value in stdio_env_values(servers) {
        MASK.clone_into(value);
    }
}

fn stdio_env_values(servers: &mut [McpServer]) -> impl Iterator<Item = &mut String> {
    servers
        .iter_mut()
        .flat_map(|s| match s {
            McpServer::Stdio { env, .. } => Some(env.values_mut()),
            McpServer::Http { .. } => None,
        })
        .flatten()
}

/// The key in `data_dir`'s key file, made (random, `0600`) when missing.
/// Two processes starting at once agree: the file appears whole, by a
/// hard link that fails when another made it first.
fn key_file(data_dir: &Path) -> Result<String, WorkspaceError> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let path = data_dir.join(KEY_FILE);
    let io = |e| WorkspaceError::io(&path, e);
    if !path.exists() {
        let tmp = data_dir.join(format!("{KEY_FILE}.{}", crate::tokens::random_id()));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                writeln!(f, "{}", B64.encode(rand::random::<[u8; 32]>()))?;
                f.sync_all()
            })
            .and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match made {
            Ok(()) => {
                tracing::info!(path = %path.display(), "made the secret key file: back it up")
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    let mode = std::fs::metadata(&path).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    std::fs::read_to_string(&path).map_err(io)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn key() -> String {
        B64.encode(rand::random::<[u8; 32]>())
    }

    #[test]
    fn a_sealed_value_opens_and_never_shows_the_clear_text() {
        let s = Sealer::random();
        let a = s.seal("hunter2");
        let b = s.seal("hunter2");
        assert!(a.starts_with(PREFIX) && !a.contains("hunter2"), "{a}");
        assert_ne!(a, b, "a nonce per value");
        assert_eq!(s.open(&a).unwrap(), "hunter2");
        assert_eq!(s.open("clear from before").unwrap(), "clear from before");
        assert_eq!(s.reseal(&a).unwrap(), None);
        let sealed = s.reseal("clear").unwrap().unwrap();
        assert_eq!(s.open(&sealed).unwrap(), "clear");
        // Tampered: refused, not garbage.
        let mut bad = a.clone();
        bad.pop();
        bad.push(if a.ends_with('A') { 'B' } else { 'A' });
        assert!(s.open(&bad).is_err());
        assert!(!format!("{s:?}").contains(&key()[..4]));
    }

    #[test]
    fn a_new_key_reads_the_old_one_and_reseals_under_itself() {
        let dir = tempfile::tempdir().unwrap();
        let (k1, k2) = (key(), key());
        let one = Sealer::load(Some(&k1), None, dir.path(), true).unwrap();
        let sealed = one.seal("v");
        let two = Sealer::load(Some(&k2), None, dir.path(), true).unwrap();
        assert!(two.open(&sealed).is_err(), "another key");
        let both = Sealer::load(Some(&k2), Some(&k1), dir.path(), true).unwrap();
        assert_eq!(both.open(&sealed).unwrap(), "v");
        let resealed = both.reseal(&sealed).unwrap().unwrap();
        assert_eq!(two.open(&resealed).unwrap(), "v");
        assert!(Sealer::load(Some("short"), None, dir.path(), false).is_err());
        assert!(Sealer::load(None, None, dir.path(), true).is_err());
    }

    #[test]
    fn the_key_file_is_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let one = Sealer::load(None, None, dir.path(), false).unwrap();
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = Sealer::load(None, None, dir.path(), false).unwrap();
        assert_eq!(again.open(&one.seal("x")).unwrap(), "x");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_masked_mcp_value_keeps_the_stored_one() {
        let s = Sealer::random();
        let server = |v: &str| McpServer::Stdio {
            name: "m".into(),
            command: "c".into(),
            args: vec![],
            env: BTreeMap::from([("TOKEN".to_owned(), v.to_owned())]),
        };
        let mut stored = vec![server("first")];
        assert!(s.seal_servers(&mut stored, &[], "mcpServers").is_empty());
        let mut shown = stored.clone();
        mask_servers(&mut shown);
        assert_eq!(shown, vec![server(MASK)]);
        let mut again = shown.clone();
        assert!(s.seal_servers(&mut again, &stored, "mcpServers").is_empty());
        assert_eq!(again, stored, "the mask kept the stored value");
        let mut fresh = vec![server(MASK)];
        let errors = s.seal_servers(&mut fresh, &[], "mcpServers");
        assert_eq!(errors[0].field, "mcpServers[0].env.TOKEN");
        s.open_servers(&mut again).unwrap();
        assert_eq!(again, vec![server("first")]);
    }
}
