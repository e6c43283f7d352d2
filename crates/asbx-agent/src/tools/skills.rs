//! Skills: bundles from `/config` (`name`, `description`, `files`) placed in
//! the sandbox under `<workdir>/.skills/<name>/`.
//!
//! Only each skill's name and description go into the system prompt
//! ([`Skills::prompt_section`]); the model reads a skill's instructions with
//! the `load_skill` tool ([`LOAD_SKILL`]), which answers the `SKILL.md` text
//! kept in memory (not re-read from the sandbox, where a tool could have
//! changed it) and the bundle's file list. Scripts are run by the model
//! through `shell`.
//!
//! Step names: a `load_skill` call is a step named `load_skill`; a `shell`
//! call whose command runs one of a bundle's scripts is a step named
//! `<skill>/<path>` (for example `recipes/scripts/add-node.sh`), see
//! [`Skills::step_name_for_command`]. The model still sees the tool `shell`.
//!
//! Validation: the shared rules of [`asbx_protocol::rules::skills`] (the
//! same the workspace applies when it accepts a definition); a bundle that
//! breaks one, repeats a name, or would take the run over the limits on
//! count or total size, is skipped as a whole with a `warn` log. Files under
//! `scripts/` and files starting with `#!` are written executable (0755),
//! the rest 0644, folders 0755: the tools may run a bundle, not change it.
//! Files are written by walking from the working directory without following
//! symlinks (the setup script ran before and could have planted one).

use std::os::fd::AsFd;
use std::path::Path;

use asbx_protocol::LogLevel;
use asbx_protocol::callback::Skill;
use asbx_protocol::rules::skills::{self as rules, INSTRUCTIONS, MAX_SKILLS, MAX_TOTAL_BYTES};
use asbx_protocol::rules::truncate_with_marker;
use nix::sys::stat::{Mode, fchmod};
use serde_json::{Value, json};

use super::context::{DISPLAY_BYTES, ToolOutput, cut};
use super::files::{components, create_regular, errno_msg, open_dir, open_root};
use crate::emit::Emitter;
use crate::providers::ToolSpec;

/// The folder of the working directory that holds the bundles.
pub(crate) const SKILLS_DIR: &str = asbx_protocol::rules::skills::DIR;
/// The tool that loads a skill's instructions.
pub(crate) const LOAD_SKILL: &str = "load_skill";
/// One skill placed in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InstalledSkill {
    pub(crate) name: String,
    pub(crate) description: String,
    /// Paths inside the bundle, sorted.
    pub(crate) files: Vec<String>,
    /// Paths written executable.
    pub(crate) scripts: Vec<String>,
    /// The `SKILL.md` text, if the bundle has one.
    pub(crate) instructions: Option<String>,
}

/// The skills of this run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Skills {
    list: Vec<InstalledSkill>,
}

fn is_script(path: &str, content: &str) -> bool {
    path.starts_with("scripts/") || content.starts_with("#!")
}

/// Writes one bundle under `<workdir>/.skills/<name>/`.
fn write_bundle(workdir: &Path, skill: &Skill) -> Result<(), String> {
    for (path, content) in &skill.files {
        let full = format!("{SKILLS_DIR}/{}/{path}", skill.name);
        let comps = components(workdir, &full)?;
        let Some((name, dirs)) = comps.split_last() else {
            return Err(format!("{full}: is a directory"));
        };
        let dir = open_dir(open_root(workdir)?, dirs, Some(0o755), &full)?;
        let mode = if is_script(path, content) {
            0o755
        } else {
            0o644
        };
        let (fd, _) = create_regular(&dir, name, mode, &full)?;
        // The umask may have taken bits away; scripts must be executable.
        fchmod(fd.as_fd(), Mode::from_bits_truncate(mode)).map_err(|e| errno_msg(&full, e))?;
        let mut f = std::fs::File::from(fd);
        std::io::Write::write_all(&mut f, content.as_bytes())
            .map_err(|e| format!("{full}: {e}"))?;
    }
    // Folders are made 0755 whatever the umask, so the tool user can read
    // and run the bundle.
    let mut dirs: Vec<String> = vec![SKILLS_DIR.into(), format!("{SKILLS_DIR}/{}", skill.name)];
    for path in skill.files.keys() {
        let mut parts: Vec<&str> = path.split('/').collect();
        parts.pop();
        for i in 1..=parts.len() {
            dirs.push(format!(
                "{SKILLS_DIR}/{}/{}",
                skill.name,
                parts[..i].join("/")
            ));
        }
    }
    dirs.sort();
    dirs.dedup();
    for d in dirs {
        let comps = components(workdir, &d)?;
        let fd = open_dir(open_root(workdir)?, &comps, None, &d)?;
        fchmod(fd.as_fd(), Mode::from_bits_truncate(0o755)).map_err(|e| errno_msg(&d, e))?;
    }
    Ok(())
}

impl Skills {
    /// Validates and writes the bundles, logging a `warn` line for each one
    /// skipped and an `info` line with the count.
    pub(crate) async fn install(
        workdir: &Path,
        bundles: &[Skill],
        emitter: &Emitter,
    ) -> std::io::Result<Skills> {
        let mut list: Vec<InstalledSkill> = Vec::new();
        let mut total = 0usize;
        for (i, skill) in bundles.iter().enumerate() {
            let reason = if i >= MAX_SKILLS {
                Some(format!("more than {MAX_SKILLS} skills"))
            } else if list.iter().any(|s| s.name == skill.name) {
                Some("a skill of that name is already loaded".into())
            } else {
                rules::check(skill).err()
            };
            let size = rules::bundle_bytes(skill);
            let reason = reason.or_else(|| {
                (total + size > MAX_TOTAL_BYTES)
                    .then(|| format!("all skills together exceed {MAX_TOTAL_BYTES} bytes"))
            });
            let reason = match reason {
                Some(r) => Some(r),
                None => {
                    let (w, s) = (workdir.to_path_buf(), skill.clone());
                    match tokio::task::spawn_blocking(move || write_bundle(&w, &s)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(format!("cannot write it: {e}")),
                        Err(e) => Some(format!("cannot write it: {e}")),
                    }
                }
            };
            if let Some(r) = reason {
                emitter
                    .log(
                        LogLevel::Warn,
                        format!(
                            "skill {:?} skipped: {r}",
                            truncate_with_marker(&skill.name, 64)
                        ),
                    )
                    .await?;
                continue;
            }
            total += size;
            list.push(InstalledSkill {
                name: skill.name.clone(),
                description: skill.description.clone(),
                files: skill.files.keys().cloned().collect(),
                scripts: skill
                    .files
                    .iter()
                    .filter(|(p, c)| is_script(p, c))
                    .map(|(p, _)| p.clone())
                    .collect(),
                instructions: skill.files.get(INSTRUCTIONS).cloned(),
            });
        }
        if !bundles.is_empty() {
            let n = list.len();
            emitter
                .log(
                    LogLevel::Info,
                    format!("Loaded {n} skill{}", if n == 1 { "" } else { "s" }),
                )
                .await?;
        }
        Ok(Skills { list })
    }

    /// Skills already in place.
    #[cfg(test)]
    fn from_installed(list: Vec<InstalledSkill>) -> Skills {
        Skills { list }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The part of the system prompt naming the skills, if there are any.
    pub(crate) fn prompt_section(&self) -> Option<String> {
        if self.list.is_empty() {
            return None;
        }
        let mut s = format!(
            "## Skills\n\nSkills are bundles of instructions and scripts in the working \
             directory under `{SKILLS_DIR}/<name>/`. Before using a skill, call the \
             `{LOAD_SKILL}` tool with its name to read its instructions; run its scripts \
             with the `shell` tool, for example `{SKILLS_DIR}/<name>/scripts/<script>`.\n\n\
             Available skills:\n"
        );
        for sk in &self.list {
            let desc = sk.description.trim();
            let desc = truncate_with_marker(desc, 1024).replace('\n', " ");
            if desc.is_empty() {
                s.push_str(&format!("- {}\n", sk.name));
            } else {
                s.push_str(&format!("- {}: {desc}\n", sk.name));
            }
        }
        Some(s)
    }

    /// The `load_skill` tool, offered only when there are skills.
    pub(crate) fn spec(&self) -> Option<ToolSpec> {
        if self.list.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.list.iter().map(|s| s.name.as_str()).collect();
        Some(ToolSpec {
            name: LOAD_SKILL.into(),
            description: "Load a skill's instructions (its SKILL.md) and the list of its files. \
                          Call it before using the skill."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {"name": {"type": "string", "enum": names, "description": "The skill's name."}},
                "required": ["name"],
                "additionalProperties": false
            }),
        })
    }

    /// `load_skill {name}`.
    pub(crate) fn load(&self, args: &Value, output_bytes: usize) -> ToolOutput {
        let Some(name) = args.get("name").and_then(Value::as_str) else {
            return ToolOutput::failed(format!("{LOAD_SKILL} needs a string argument `name`"));
        };
        let Some(sk) = self.list.iter().find(|s| s.name == name) else {
            let known: Vec<&str> = self.list.iter().map(|s| s.name.as_str()).collect();
            return ToolOutput::failed(format!(
                "no skill named {name:?}; skills: {}",
                known.join(", ")
            ));
        };
        let dir = format!("{SKILLS_DIR}/{}", sk.name);
        let mut text = format!("Skill `{}`; its files are under `{dir}/`:\n", sk.name);
        for f in &sk.files {
            let exec = if sk.scripts.contains(f) {
                " (executable)"
            } else {
                ""
            };
            text.push_str(&format!("- {dir}/{f}{exec}\n"));
        }
        text.push('\n');
        match &sk.instructions {
            Some(body) => text.push_str(body),
            None => text.push_str("(this skill has no SKILL.md)"),
        }
        let body = sk.instructions.as_deref().unwrap_or("");
        ToolOutput {
            model_text: cut(text.as_bytes(), text.len(), output_bytes),
            display: Ok(json!({
                "skill": sk.name,
                "path": dir,
                "files": sk.files,
                "instructions": cut(body.as_bytes(), body.len(), DISPLAY_BYTES),
            })),
        }
    }

    /// The step name of a `shell` command that runs a bundle's script:
    /// `<skill>/<path>` for the first word of the command that names one
    /// (as `.skills/<skill>/<path>`, `./.skills/...`, `<workdir>/.skills/...`
    /// or `<skill>/<path>`).
    pub(crate) fn step_name_for_command(&self, workdir: &Path, command: &str) -> Option<String> {
        if self.list.is_empty() {
            return None;
        }
        let abs_prefix = format!("{}/", workdir.display());
        let is_sep = |c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    ';' | '&' | '|' | '(' | ')' | '`' | '"' | '\'' | '<' | '>' | '$' | '{' | '}'
                )
        };
        for word in command.split(is_sep).filter(|w| !w.is_empty()) {
            let mut w = word.strip_prefix(abs_prefix.as_str()).unwrap_or(word);
            while let Some(rest) = w.strip_prefix("./") {
                w = rest;
            }
            let w = w
                .strip_prefix(SKILLS_DIR)
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(w);
            let Some((skill, path)) = w.split_once('/') else {
                continue;
            };
            if let Some(sk) = self.list.iter().find(|s| s.name == skill)
                && sk.scripts.iter().any(|p| p == path)
            {
                return Some(format!("{skill}/{path}"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(name: &str, files: &[(&str, &str)]) -> Skill {
        Skill {
            name: name.into(),
            description: "d".into(),
            files: files
                .iter()
                .map(|(p, c)| ((*p).to_owned(), (*c).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn bundles_follow_the_shared_rules() {
        assert!(rules::check(&skill("s", &[("a", "x"), ("a/b", "y")])).is_err());
        assert!(rules::check(&skill("s", &[("scripts/x.sh", "x")])).is_ok());
        assert!(rules::check(&skill(".s", &[])).is_err());
        assert!(
            is_script("scripts/x", "x") && is_script("run", "#!/bin/sh") && !is_script("a", "b")
        );
    }

    #[test]
    fn script_step_names() {
        let skills = Skills::from_installed(vec![InstalledSkill {
            name: "recipes".into(),
            description: "d".into(),
            files: vec![
                "SKILL.md".into(),
                "add-node.sh".into(),
                "scripts/x.sh".into(),
            ],
            scripts: vec!["add-node.sh".into(), "scripts/x.sh".into()],
            instructions: Some("body".into()),
        }]);
        let w = Path::new("/work/dir");
        let name = |c: &str| skills.step_name_for_command(w, c);
        assert_eq!(
            name(".skills/recipes/add-node.sh --type x").as_deref(),
            Some("recipes/add-node.sh")
        );
        assert_eq!(
            name("bash ./.skills/recipes/scripts/x.sh").as_deref(),
            Some("recipes/scripts/x.sh")
        );
        assert_eq!(
            name("cd /tmp && /work/dir/.skills/recipes/scripts/x.sh").as_deref(),
            Some("recipes/scripts/x.sh")
        );
        assert_eq!(
            name("recipes/scripts/x.sh").as_deref(),
            Some("recipes/scripts/x.sh")
        );
        assert_eq!(name("cat .skills/recipes/SKILL.md"), None);
        assert_eq!(name("ls -la"), None);
        assert_eq!(name(".skills/other/scripts/x.sh"), None);
    }

    #[test]
    fn prompt_lists_names_and_descriptions_only() {
        let skills = Skills::from_installed(vec![InstalledSkill {
            name: "recipes".into(),
            description: "Adds nodes.".into(),
            files: vec!["SKILL.md".into()],
            scripts: vec![],
            instructions: Some("SECRET BODY".into()),
        }]);
        let p = skills.prompt_section().unwrap();
        assert!(p.contains("- recipes: Adds nodes."));
        assert!(p.contains(LOAD_SKILL));
        assert!(!p.contains("SECRET BODY"));
        let out = skills.load(&json!({"name": "recipes"}), 10_000);
        assert!(out.model_text.contains("SECRET BODY"));
        assert!(out.model_text.contains(".skills/recipes/SKILL.md"));
        assert!(skills.load(&json!({"name": "nope"}), 100).is_error());
        assert!(Skills::default().prompt_section().is_none());
    }
}
