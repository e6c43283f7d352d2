//! What a skill bundle may be. The workspace refuses a definition that breaks
//! a rule (naming the field); the agent installs only bundles that keep them.

use std::collections::BTreeSet;

use crate::callback::Skill;
use crate::problem::FieldError;

/// Most skills per run.
pub const MAX_SKILLS: usize = 64;
/// Most files per bundle.
pub const MAX_FILES_PER_SKILL: usize = 256;
/// Largest file of a bundle, in bytes.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// Most bytes of all bundles of a run together (paths and contents).
pub const MAX_TOTAL_BYTES: usize = 16 * 1024 * 1024;
/// Longest path of a file inside a bundle.
pub const MAX_PATH_BYTES: usize = 256;
/// Longest skill name.
pub const MAX_NAME_BYTES: usize = 64;
/// The instructions file of a bundle.
pub const INSTRUCTIONS: &str = "SKILL.md";
/// The folder of the working directory the agent writes the bundles into,
/// `<workdir>/.skills/<name>/`, at every run's start. It is made from the
/// run's config, so a chat's kept directory leaves it out
/// ([`crate::workdir::is_installed`]).
pub const DIR: &str = ".skills";

/// Whether `name` is a skill name: 1 to 64 of `[A-Za-z0-9_.-]`, not starting
/// with `.` (so never `.`, `..` or a hidden folder).
pub fn valid_name(name: &str) -> bool {
    super::names::is_name(name, MAX_NAME_BYTES, b"_.-") && !name.starts_with('.')
}

/// Checks one path inside a bundle.
pub fn check_path(path: &str) -> Result<(), String> {
    super::names::check_relative_path_within(path, MAX_PATH_BYTES)
}

/// Every problem of one bundle, as `(field suffix, message)`; the total size
/// across bundles and name uniqueness are [`check_skills`]'s.
pub fn problems(skill: &Skill) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if !valid_name(&skill.name) {
        out.push((
            "name".to_owned(),
            format!("must be 1 to {MAX_NAME_BYTES} characters [A-Za-z0-9_.-], not starting with ."),
        ));
    }
    if skill.files.len() > MAX_FILES_PER_SKILL {
        out.push((
            "files".to_owned(),
            format!(
                "{} files, at most {MAX_FILES_PER_SKILL} allowed",
                skill.files.len()
            ),
        ));
    }
    for (path, content) in &skill.files {
        if let Err(msg) = check_path(path) {
            out.push((format!("files.{path}"), msg));
        } else if content.len() > MAX_FILE_BYTES {
            out.push((
                format!("files.{path}"),
                format!("{} bytes, at most {MAX_FILE_BYTES} allowed", content.len()),
            ));
        }
    }
    // `a` and `a/b` cannot both be files.
    for path in skill.files.keys() {
        let prefix = format!("{path}/");
        if skill
            .files
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(p, _)| p.starts_with(&prefix))
        {
            out.push((
                format!("files.{path}"),
                "is both a file and a folder".to_owned(),
            ));
        }
    }
    out
}

/// Checks one bundle; the first problem as text.
pub fn check(skill: &Skill) -> Result<(), String> {
    match problems(skill).into_iter().next() {
        None => Ok(()),
        Some((field, msg)) => Err(format!("{field}: {msg}")),
    }
}

/// Bytes a bundle counts toward [`MAX_TOTAL_BYTES`].
pub fn bundle_bytes(skill: &Skill) -> usize {
    skill.files.iter().map(|(p, c)| p.len() + c.len()).sum()
}

/// Every problem of a run's skills, as field errors under `field`
/// (`skills[2].files.x.sh`).
pub fn check_skills(skills: &[Skill], field: &str, errors: &mut Vec<FieldError>) {
    if skills.len() > MAX_SKILLS {
        errors.push(FieldError::new(
            field,
            format!("{} skills, at most {MAX_SKILLS} allowed", skills.len()),
        ));
    }
    let total: usize = skills.iter().map(bundle_bytes).sum();
    if total > MAX_TOTAL_BYTES {
        errors.push(FieldError::new(
            field,
            format!("{total} bytes in all, at most {MAX_TOTAL_BYTES} allowed"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, skill) in skills.iter().enumerate() {
        let at = format!("{field}[{i}]");
        for (suffix, msg) in problems(skill) {
            errors.push(FieldError::new(&format!("{at}.{suffix}"), msg));
        }
        if valid_name(&skill.name) && !seen.insert(skill.name.as_str()) {
            errors.push(FieldError::new(&format!("{at}.name"), "is a duplicate"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn skill(name: &str, files: &[(&str, usize)]) -> Skill {
        Skill {
            name: name.to_owned(),
            description: String::new(),
            files: files
                .iter()
                .map(|(p, n)| ((*p).to_owned(), "x".repeat(*n)))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn fields(skills: &[Skill]) -> Vec<String> {
        let mut errors = Vec::new();
        check_skills(skills, "skills", &mut errors);
        errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn names() {
        assert!(valid_name("pdf-tools_1.2"));
        for bad in ["", ".hidden", ".", "..", "a/b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn every_limit_names_its_field() {
        assert!(fields(&[skill("ok", &[("SKILL.md", 10)])]).is_empty());
        assert_eq!(fields(&[skill(".hidden", &[])]), ["skills[0].name"]);
        assert_eq!(
            fields(&[skill("big", &[("a", MAX_FILE_BYTES + 1)])]),
            ["skills[0].files.a"]
        );
        let long = "p".repeat(MAX_PATH_BYTES + 1);
        assert_eq!(
            fields(&[skill("p", &[(long.as_str(), 1)])]),
            [format!("skills[0].files.{long}")]
        );
        assert_eq!(
            fields(&[skill("d", &[("a", 1), ("a/b", 1)])]),
            ["skills[0].files.a"]
        );
        assert_eq!(
            fields(&[skill("x", &[]), skill("x", &[])]),
            ["skills[1].name"]
        );
        let many: Vec<Skill> = (0..=MAX_SKILLS)
            .map(|i| skill(&format!("s{i}"), &[]))
            .collect();
        assert_eq!(fields(&many), ["skills"]);
        let heavy: Vec<Skill> = (0..17)
            .map(|i| skill(&format!("h{i}"), &[("f", MAX_FILE_BYTES)]))
            .collect();
        assert_eq!(fields(&heavy), ["skills"]);
    }
}
