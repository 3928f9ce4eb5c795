//! `REPO[:QUANT]`, the name a model is fetched by (llama.cpp's `-hf`), and how a quant
//! picks one GGUF file — or one set of split files — out of a repository's files.

/// A Hugging Face model repository and, optionally, the quantization to take from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// `owner/name`.
    pub repo: String,
    /// Matched case-insensitively against file names (`Q4_K_M`, `q8_0`, `f16`).
    pub quant: Option<String>,
}

/// Quants tried in order when none is given, as llama.cpp does; then the first GGUF.
pub const DEFAULT_QUANTS: [&str; 2] = ["Q4_K_M", "Q8_0"];

impl ModelRef {
    pub fn parse(text: &str) -> Result<ModelRef, String> {
        let bad = |why: &str| {
            format!("'{text}' is not a Hugging Face model: {why} (expected OWNER/NAME[:QUANT], e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)")
        };
        let (repo, quant) = match text.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (text, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 {
            return Err(bad("the repository needs exactly one '/'"));
        }
        for p in &parts {
            let ok = !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Err(bad("owner and name are letters, digits, '-', '_' or '.'"));
            }
        }
        let quant = match quant {
            Some(q) if q.is_empty() || q.contains(['/', ':', '\\']) => {
                return Err(bad("the quant after ':' is empty or has a path character"))
            }
            Some(q) => Some(q.to_string()),
            None => None,
        };
        Ok(ModelRef {
            repo: repo.to_string(),
            quant,
        })
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// One file of a repository (or of its cached snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// Path inside the repository, `/`-separated.
    pub path: String,
    pub size: u64,
    /// The LFS SHA-256 the Hub gives (hex), where known.
    pub sha256: Option<String>,
}

/// Where a file sits in a split model: `NAME-00002-of-00003.gguf` is part 2 of 3 of `NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The path without `-0000i-of-0000n.gguf`.
    pub prefix: String,
    pub index: u32,
    pub count: u32,
}

pub fn split_of(path: &str) -> Option<Split> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(count) {
        return None;
    }
    let (index, count) = (index.parse().ok()?, count.parse().ok()?);
    (1..=count).contains(&index).then(|| Split {
        prefix: prefix.to_string(),
        index,
        count,
    })
}

/// The name a split model's parts are joined into: `NAME.gguf`.
pub fn joined_name(split: &Split) -> String {
    format!("{}.gguf", split.prefix)
}

/// A model file, not a projector or a draft head beside it.
fn is_model(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".gguf") && !lower.contains("mmproj")
}

/// The files making up the model `quant` names: one file, or every part of a split one
/// in order. `quant` matches a file whose name holds it followed by `.` or `-` (an exact
/// tag), else one that holds it anywhere; none given tries [`DEFAULT_QUANTS`], then the
/// first GGUF file.
pub fn choose<'f>(
    files: &'f [RepoFile],
    quant: Option<&str>,
    repo: &str,
) -> Result<Vec<&'f RepoFile>, String> {
    let firsts: Vec<&RepoFile> = files
        .iter()
        .filter(|f| is_model(&f.path))
        .filter(|f| split_of(&f.path).is_none_or(|s| s.index == 1))
        .collect();
    let holds = |f: &RepoFile, q: &str, exact: bool| {
        let name = f.path.to_ascii_lowercase();
        let q = q.to_ascii_lowercase();
        if exact {
            name.contains(&format!("{q}.")) || name.contains(&format!("{q}-"))
        } else {
            name.contains(&q)
        }
    };
    let pick = |q: &str| {
        firsts
            .iter()
            .find(|f| holds(f, q, true))
            .or_else(|| firsts.iter().find(|f| holds(f, q, false)))
            .copied()
    };
    let first = match quant {
        Some(q) => pick(q),
        None => DEFAULT_QUANTS
            .iter()
            .find_map(|q| pick(q))
            .or_else(|| firsts.first().copied()),
    };
    let Some(first) = first else {
        let all: Vec<&str> = files
            .iter()
            .filter(|f| f.path.ends_with(".gguf"))
            .map(|f| f.path.as_str())
            .collect();
        let wanted = match quant {
            Some(q) => format!("no GGUF file matching '{q}'"),
            None => "no GGUF file".to_string(),
        };
        return Err(match all.is_empty() {
            true => format!("{repo} has {wanted}"),
            false => format!("{repo} has {wanted}; its GGUF files: {}", all.join(", ")),
        });
    };
    let Some(split) = split_of(&first.path) else {
        return Ok(vec![first]);
    };
    let mut parts = Vec::new();
    for i in 1..=split.count {
        let name = format!("{}-{i:05}-of-{:05}.gguf", split.prefix, split.count);
        match files.iter().find(|f| f.path == name) {
            Some(f) => parts.push(f),
            None => {
                return Err(format!(
                    "{repo}: {} is split in {} parts but {name} is missing",
                    split.prefix, split.count
                ))
            }
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> RepoFile {
        RepoFile {
            path: path.into(),
            size: 1,
            sha256: None,
        }
    }

    #[test]
    fn names_parse_or_say_what_is_wrong() {
        let r = ModelRef::parse("bartowski/SmolLM2-GGUF:q4_k_m").unwrap();
        assert_eq!(r.repo, "bartowski/SmolLM2-GGUF");
        assert_eq!(r.quant.as_deref(), Some("q4_k_m"));
        assert_eq!(ModelRef::parse("a/b").unwrap().quant, None);
        for bad in ["foo", "a/b/c", "../x", "a/..", "a/b:", "a b/c", "/b"] {
            let e = ModelRef::parse(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("OWNER/NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn splits_are_recognised() {
        assert_eq!(
            split_of("Q4/m-Q4_K_M-00002-of-00003.gguf"),
            Some(Split {
                prefix: "Q4/m-Q4_K_M".into(),
                index: 2,
                count: 3
            })
        );
        assert_eq!(split_of("m-Q4_K_M.gguf"), None);
        assert_eq!(split_of("m-00004-of-00003.gguf"), None);
        assert_eq!(split_of("m-1-of-3.gguf"), None);
    }

    #[test]
    fn a_quant_picks_its_file_and_the_default_prefers_q4_k_m() {
        let files = [
            file("README.md"),
            file("m-Q4_K_S.gguf"),
            file("m-Q8_0.gguf"),
            file("m-Q4_K_M.gguf"),
            file("mmproj-m-f16.gguf"),
            file("m-F16-00002-of-00002.gguf"),
            file("m-F16-00001-of-00002.gguf"),
        ];
        let pick = |q: Option<&str>| -> Vec<String> {
            choose(&files, q, "o/m")
                .unwrap()
                .iter()
                .map(|f| f.path.clone())
                .collect()
        };
        assert_eq!(pick(None), ["m-Q4_K_M.gguf"]);
        assert_eq!(pick(Some("q8_0")), ["m-Q8_0.gguf"]);
        // Q4_K is no exact tag; the first file holding it is taken.
        assert_eq!(pick(Some("Q4_K")), ["m-Q4_K_S.gguf"]);
        assert_eq!(
            pick(Some("f16")),
            ["m-F16-00001-of-00002.gguf", "m-F16-00002-of-00002.gguf"]
        );
        let e = choose(&files, Some("Q2_K"), "o/m").unwrap_err();
        assert!(
            e.contains("no GGUF file matching 'Q2_K'") && e.contains("m-Q8_0.gguf"),
            "{e}"
        );
        let e = choose(&[file("m-F16-00001-of-00002.gguf")], Some("F16"), "o/m").unwrap_err();
        assert!(e.contains("m-F16-00002-of-00002.gguf is missing"), "{e}");
        assert_eq!(
            choose(&[file("x.gguf")], None, "o/m").unwrap()[0].path,
            "x.gguf"
        );
    }
}
