//! Platform: DMI identity (EC2 instance type), NCCL topology files, NCCL and its
//! network plugin on disk, /etc/nccl.conf.

use crate::paths::{self, Root};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toporun_shared::facts::PlatformFacts;

/// pip's NCCL (`nvidia-nccl-cu12`, `-cu13`) beside the ranks' Python: its version is in
/// the dist-info name, where `libnccl.so.2` alone says nothing. `python`: PYTHON_EXEC or
/// python3 on PATH.
struct PipNccl {
    version: String,
    from: String,
    /// torch in the same directory requires it (pip's torch wheels load it through
    /// their RPATH, whatever libnccl the system has); None: no torch there.
    torch_requires: Option<bool>,
}

/// Where the ranks' Python finds its packages: its own site-packages, then the
/// system's.
fn python_package_dirs(root: &Root, python: Option<&Path>) -> Vec<String> {
    let mut dirs: Vec<String> = python.map(|p| site_packages(root, p)).unwrap_or_default();
    dirs.extend(paths::SYSTEM_PYTHON_PACKAGES.iter().map(|d| d.to_string()));
    for py in root
        .list("usr/local/lib")
        .into_iter()
        .filter(|d| d.starts_with("python3"))
    {
        dirs.push(format!("usr/local/lib/{py}/dist-packages"));
        dirs.push(format!("usr/local/lib/{py}/site-packages"));
    }
    dirs
}

fn pip_nccl(root: &Root, python: Option<&Path>) -> Option<PipNccl> {
    let dirs = python_package_dirs(root, python);
    dirs.iter().find_map(|d| {
        let listing = root.list(d);
        listing.iter().find_map(|f| {
            let rest = f
                .strip_prefix("nvidia_nccl_cu")?
                .strip_suffix(".dist-info")?;
            let (cuda, version) = rest.split_once('-')?;
            Some(PipNccl {
                version: version.to_string(),
                from: format!("pip nvidia-nccl-cu{cuda} in /{d}"),
                torch_requires: torch_requires_nccl(root, d, &listing),
            })
        })
    })
}

/// The version of the torch the ranks' Python imports (`torch-2.11.0+cu130.dist-info`:
/// 2.11.0), from the same places as pip's NCCL.
fn pip_torch(root: &Root, python: Option<&Path>) -> Option<String> {
    python_package_dirs(root, python).iter().find_map(|d| {
        root.list(d).iter().find_map(|f| {
            let v = f.strip_prefix("torch-")?.strip_suffix(".dist-info")?;
            Some(v.split('+').next().unwrap_or(v).to_string())
        })
    })
}

/// Whether the torch installed in `dir` requires pip's NCCL (`Requires-Dist:
/// nvidia-nccl-...` in its METADATA); None where torch is not there.
fn torch_requires_nccl(root: &Root, dir: &str, listing: &[String]) -> Option<bool> {
    let info = listing
        .iter()
        .find(|f| f.starts_with("torch-") && f.ends_with(".dist-info"))?;
    let meta = root.read(format!("{dir}/{info}/METADATA"))?;
    Some(
        meta.lines()
            .any(|l| l.starts_with("Requires-Dist:") && l.contains("nvidia-nccl")),
    )
}

/// The version of the system's libnccl.so.X.Y.Z, from the real file's name.
fn disk_nccl(libs: &[(&str, Vec<String>)]) -> Option<String> {
    libs.iter().find_map(|(_, files)| {
        files.iter().find_map(|f| {
            f.strip_prefix("libnccl.so.")
                .filter(|v| v.matches('.').count() == 2)
                .map(str::to_string)
        })
    })
}

/// The NCCL the ranks will load, where it was read, and the system's libnccl when that
/// is another one.
struct RankNccl {
    version: Option<String>,
    from: Option<String>,
    on_disk: Option<String>,
}

/// pip's beside the ranks' Python where its torch requires it (or no torch is there
/// to say), else the library on disk (an NGC image's torch links it).
fn rank_nccl(root: &Root, python: Option<&Path>, libs: &[(&str, Vec<String>)]) -> RankNccl {
    let disk = disk_nccl(libs);
    match pip_nccl(root, python) {
        Some(p) if p.torch_requires != Some(false) || disk.is_none() => RankNccl {
            from: Some(match p.torch_requires {
                Some(true) => format!("{}, which the ranks' torch loads", p.from),
                _ => p.from,
            }),
            version: Some(p.version),
            on_disk: disk,
        },
        _ => RankNccl {
            from: disk
                .as_ref()
                .map(|_| "libnccl.so.X.Y.Z on disk".to_string()),
            version: disk,
            on_disk: None,
        },
    }
}

/// The site-packages directories of `python` (a venv's or a prefix's).
fn site_packages(root: &Root, python: &Path) -> Vec<String> {
    let Some(prefix) = python.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let rel = prefix.to_string_lossy().trim_start_matches('/').to_string();
    let mut dirs = Vec::new();
    for lib in ["lib", "lib64"] {
        let base = if rel.is_empty() {
            lib.to_string()
        } else {
            format!("{rel}/{lib}")
        };
        for py in root
            .list(&base)
            .into_iter()
            .filter(|d| d.starts_with("python3"))
        {
            dirs.push(format!("{base}/{py}/site-packages"));
            dirs.push(format!("{base}/{py}/dist-packages"));
        }
    }
    dirs
}

/// Names registered under an entry-point `group` (`torchrun.logs_specs`) by the
/// packages installed for `python`.
pub fn entry_points(root: &Root, python: &Path, group: &str) -> Vec<String> {
    let header = format!("[{group}]");
    let mut names = Vec::new();
    for dir in site_packages(root, python) {
        for info in root
            .list(&dir)
            .into_iter()
            .filter(|d| d.ends_with(".dist-info"))
        {
            let Some(text) = root.read(format!("{dir}/{info}/entry_points.txt")) else {
                continue;
            };
            let mut inside = false;
            for line in text.lines().map(str::trim) {
                if line.starts_with('[') {
                    inside = line == header;
                } else if inside {
                    if let Some((name, _)) = line.split_once('=') {
                        names.push(name.trim().to_string());
                    }
                }
            }
        }
    }
    names
}

/// The interpreter ranks will run: PYTHON_EXEC, else python3 on PATH.
pub fn rank_python(root: &Root, env: &[(String, String)]) -> Option<PathBuf> {
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if let Some(p) = get("PYTHON_EXEC").filter(|p| p.starts_with('/')) {
        return Some(PathBuf::from(p));
    }
    let name = get("PYTHON_EXEC").unwrap_or_else(|| "python3".into());
    get("PATH")?
        .split(':')
        .map(|d| Path::new(d).join(&name))
        .find(|p| {
            root.join(p.to_string_lossy().trim_start_matches('/'))
                .exists()
        })
}

pub fn probe(root: &Root, python: Option<&Path>, conf_files: &[PathBuf]) -> PlatformFacts {
    let mut topology_files = Vec::new();
    for dir in paths::TOPOLOGY_DIRS {
        for f in root.list(dir).into_iter().filter(|f| f.ends_with(".xml")) {
            topology_files.push(format!("/{dir}/{f}"));
        }
    }
    // Each directory listed once, NCCL's names only (a distribution's holds a thousand).
    let libs: Vec<(&str, Vec<String>)> = paths::LIB_DIRS
        .iter()
        .map(|dir| (*dir, root.list_starting(dir, "libnccl")))
        .collect();
    let ofi_nccl_plugins = libs
        .iter()
        .flat_map(|(dir, files)| {
            files
                .iter()
                .filter(|f| f.starts_with("libnccl-net") && f.contains(".so"))
                .map(move |f| format!("/{dir}/{f}"))
        })
        .collect();
    let nccl = rank_nccl(root, python, &libs);
    let conf = nccl_conf(root, conf_files);
    PlatformFacts {
        product_name: root
            .read(format!("{}/product_name", paths::SYS_DMI_ID))
            .filter(|s| !s.is_empty()),
        sys_vendor: root
            .read(format!("{}/sys_vendor", paths::SYS_DMI_ID))
            .filter(|s| !s.is_empty()),
        topology_files,
        ofi_nccl_plugins,
        nccl_version: nccl.version,
        nccl_version_from: nccl.from,
        nccl_on_disk: nccl.on_disk,
        torch_version: pip_torch(root, python),
        nccl_conf: conf.settings,
        nccl_conf_files: conf.files,
        nccl_conf_from: conf.from,
    }
}

/// NCCL's config files in the order NCCL reads them: NCCL_CONF_FILE where set, else
/// the user's ~/.nccl.conf (`home`: the passwd entry's, as NCCL looks it up); then
/// /etc/nccl.conf.
pub fn nccl_conf_files(env: &[(String, String)], home: Option<&Path>) -> Vec<PathBuf> {
    let named = env
        .iter()
        .find(|(k, v)| k == NCCL_CONF_FILE_VAR && !v.is_empty())
        .map(|(_, v)| PathBuf::from(v));
    let user = named.or_else(|| home.map(|h| h.join(".nccl.conf")));
    user.into_iter()
        .chain([Path::new("/").join(paths::ETC_NCCL_CONF)])
        .collect()
}

/// The most of a config file read: far more than any holds.
const CONF_LIMIT: u64 = 1 << 20;

/// The variable naming NCCL's user config file.
const NCCL_CONF_FILE_VAR: &str = "NCCL_CONF_FILE";

/// The settings of those of `files` that exist, as NCCL reads them (`setEnvFile`): a
/// line starting with `#` is a comment, one without `=` is skipped, the name is all
/// before the first `=` and the value all after it, nothing trimmed (a CRLF file's
/// values keep their `\r`); a name set in an earlier file keeps that value (NCCL's
/// setenv without overwrite).
fn nccl_conf(root: &Root, files: &[PathBuf]) -> NcclConf {
    let mut conf = NcclConf::default();
    for file in files {
        let rel = file.strip_prefix("/").unwrap_or(file);
        let Some(text) = root.read_at_most(rel, CONF_LIMIT) else {
            continue;
        };
        let path = file.display().to_string();
        for (k, v) in text
            .split('\n')
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
        {
            if !conf.settings.contains_key(k) {
                conf.settings.insert(k.to_string(), v.to_string());
                conf.from.insert(k.to_string(), path.clone());
            }
        }
        conf.files.push(path);
    }
    conf
}

/// NCCL's config files as read: the settings, the files, each setting's file.
#[derive(Default)]
struct NcclConf {
    settings: BTreeMap<String, String>,
    files: Vec<String>,
    from: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn entry_points_of_a_group() {
        let d = tempfile::tempdir().unwrap();
        let info = d
            .path()
            .join("v/lib/python3.11/site-packages/mylogs-1.0.dist-info");
        fs::create_dir_all(&info).unwrap();
        fs::write(
            info.join("entry_points.txt"),
            "[console_scripts]\nx = a:b\n\n[torchrun.logs_specs]\nfancy = mylogs:Fancy\n",
        )
        .unwrap();
        let names = entry_points(
            &Root::at(d.path()),
            Path::new("/v/bin/python3"),
            "torchrun.logs_specs",
        );
        assert_eq!(names, ["fancy"]);
    }

    #[test]
    fn pip_nccl_beside_the_ranks_python() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::at(d.path());
        fs::create_dir_all(d.path().join("venv/bin")).unwrap();
        fs::write(d.path().join("venv/bin/python3"), "").unwrap();
        fs::create_dir_all(
            d.path()
                .join("venv/lib/python3.12/site-packages/nvidia_nccl_cu12-2.27.5.dist-info"),
        )
        .unwrap();
        fs::create_dir_all(d.path().join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::write(d.path().join("usr/lib/x86_64-linux-gnu/libnccl.so.2"), "").unwrap();
        let env = vec![("PATH".to_string(), "/nowhere:/venv/bin".to_string())];
        let py = rank_python(&root, &env).unwrap();
        assert_eq!(py, PathBuf::from("/venv/bin/python3"));
        let f = probe(&root, Some(&py), &[]);
        assert_eq!(f.nccl_version.as_deref(), Some("2.27.5"));
        assert_eq!(f.torch_version, None, "no torch there");
        assert!(f.nccl_version_from.unwrap().contains("nvidia-nccl-cu12"));
        assert_eq!(probe(&root, None, &[]).nccl_version, None);
    }

    /// The 2x H100 machine (tests/fixtures/device/full-node-h100x2/nccl-version.txt):
    /// libnccl.so.2.28.3 in /usr/lib, while torch 2.11+cu130 in /opt/torch/.venv loads
    /// pip's nvidia-nccl-cu13 2.28.9 (`torch.cuda.nccl.version()`).
    fn h100x2_layout(torch_requires: &str) -> (tempfile::TempDir, Root, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let site = d
            .path()
            .join("opt/torch/.venv/lib/python3.12/site-packages");
        fs::create_dir_all(d.path().join("opt/torch/.venv/bin")).unwrap();
        fs::write(d.path().join("opt/torch/.venv/bin/python3"), "").unwrap();
        fs::create_dir_all(site.join("nvidia_nccl_cu13-2.28.9.dist-info")).unwrap();
        fs::create_dir_all(site.join("torch-2.11.0.dist-info")).unwrap();
        fs::write(
            site.join("torch-2.11.0.dist-info/METADATA"),
            format!(
                "Metadata-Version: 2.4\nName: torch\nRequires-Dist: filelock\n{torch_requires}"
            ),
        )
        .unwrap();
        fs::create_dir_all(d.path().join("usr/lib/x86_64-linux-gnu")).unwrap();
        for f in ["libnccl.so", "libnccl.so.2", "libnccl.so.2.28.3"] {
            fs::write(d.path().join("usr/lib/x86_64-linux-gnu").join(f), "").unwrap();
        }
        let root = Root::at(d.path());
        (d, root, PathBuf::from("/opt/torch/.venv/bin/python3"))
    }

    #[test]
    fn the_nccl_stated_is_the_one_the_ranks_torch_loads() {
        let requires = "Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\"\n";
        let (_d, root, py) = h100x2_layout(requires);
        let f = probe(&root, Some(&py), &[]);
        assert_eq!(f.nccl_version.as_deref(), Some("2.28.9"));
        assert_eq!(
            f.torch_version.as_deref(),
            Some("2.11.0"),
            "the ranks' torch"
        );
        let from = f.nccl_version_from.unwrap();
        assert!(
            from.contains("nvidia-nccl-cu13") && from.contains("which the ranks' torch loads"),
            "{from}"
        );
        assert_eq!(f.nccl_on_disk.as_deref(), Some("2.28.3"));
        // Without the ranks' Python, only the system's library is known.
        let f = probe(&root, None, &[]);
        assert_eq!(f.nccl_version.as_deref(), Some("2.28.3"));
        assert_eq!(f.nccl_on_disk, None);
    }

    #[test]
    fn a_torch_built_against_the_system_nccl_keeps_the_disk_version() {
        // NGC's torch links /usr/lib's libnccl; a pip NCCL another package pulled in
        // is not what it loads.
        let (_d, root, py) = h100x2_layout("");
        let f = probe(&root, Some(&py), &[]);
        assert_eq!(f.nccl_version.as_deref(), Some("2.28.3"));
        assert_eq!(
            f.nccl_version_from.as_deref(),
            Some("libnccl.so.X.Y.Z on disk")
        );
        assert_eq!(f.nccl_on_disk, None);
    }

    #[test]
    fn p4d_image_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::create_dir_all(p.join("sys/devices/virtual/dmi/id")).unwrap();
        fs::write(
            p.join("sys/devices/virtual/dmi/id/product_name"),
            "p4d.24xlarge\n",
        )
        .unwrap();
        fs::create_dir_all(p.join("opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml")).unwrap();
        fs::write(
            p.join("opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml"),
            "<system/>",
        )
        .unwrap();
        fs::create_dir_all(p.join("opt/amazon/ofi-nccl/lib")).unwrap();
        fs::write(p.join("opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"), "").unwrap();
        fs::create_dir_all(p.join("usr/lib/x86_64-linux-gnu")).unwrap();
        fs::write(p.join("usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5"), "").unwrap();
        fs::create_dir_all(p.join("etc")).unwrap();
        fs::write(p.join("etc/nccl.conf"), "# comment\nNCCL_DEBUG=WARN\n").unwrap();
        let f = probe(&Root::at(p), None, &nccl_conf_files(&[], None));
        assert_eq!(f.product_name.as_deref(), Some("p4d.24xlarge"));
        assert_eq!(
            f.topology_files,
            vec!["/opt/amazon/ofi-nccl/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml"]
        );
        assert_eq!(f.ofi_nccl_plugins.len(), 1);
        assert_eq!(f.nccl_version.as_deref(), Some("2.21.5"));
        assert_eq!(f.nccl_conf["NCCL_DEBUG"], "WARN");
    }

    #[test]
    fn nccl_s_config_files_apply_in_its_order_the_first_setting_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        fs::create_dir_all(p.join("etc")).unwrap();
        fs::create_dir_all(p.join("home/ml")).unwrap();
        fs::create_dir_all(p.join("cfg")).unwrap();
        fs::write(
            p.join("etc/nccl.conf"),
            "NCCL_TOPO_FILE=/opt/microsoft/ndv5-topo.xml\nNCCL_DEBUG=WARN\n",
        )
        .unwrap();
        fs::write(p.join("home/ml/.nccl.conf"), "NCCL_DEBUG=INFO\n").unwrap();
        fs::write(
            p.join("cfg/nccl.conf"),
            "NCCL_PROFILER_PLUGIN=/opt/x.so\r\n NCCL_ALGO = Ring\n#NCCL_PROTO=Simple\n",
        )
        .unwrap();
        let root = Root::at(p);
        let home = Some(Path::new("/home/ml"));
        let f = probe(&root, None, &nccl_conf_files(&[], home));
        assert_eq!(
            f.nccl_conf["NCCL_DEBUG"], "INFO",
            "the user's file is read first"
        );
        assert_eq!(
            f.nccl_conf["NCCL_TOPO_FILE"],
            "/opt/microsoft/ndv5-topo.xml"
        );
        assert_eq!(f.nccl_conf_files, ["/home/ml/.nccl.conf", "/etc/nccl.conf"]);
        assert_eq!(f.nccl_conf_from["NCCL_DEBUG"], "/home/ml/.nccl.conf");
        assert_eq!(f.nccl_conf_from["NCCL_TOPO_FILE"], "/etc/nccl.conf");
        // NCCL_CONF_FILE replaces the user's file, not /etc/nccl.conf.
        let env = [("NCCL_CONF_FILE".to_string(), "/cfg/nccl.conf".to_string())];
        let f = probe(&root, None, &nccl_conf_files(&env, home));
        // As NCCL reads it: the CRLF file's \r kept, the spaced name not NCCL_ALGO.
        assert_eq!(f.nccl_conf["NCCL_PROFILER_PLUGIN"], "/opt/x.so\r");
        assert_eq!(f.nccl_conf[" NCCL_ALGO "], " Ring");
        assert!(!f.nccl_conf.contains_key("NCCL_ALGO"));
        assert!(!f.nccl_conf.contains_key("#NCCL_PROTO"));
        assert_eq!(f.nccl_conf["NCCL_DEBUG"], "WARN");
        assert_eq!(f.nccl_conf_files, ["/cfg/nccl.conf", "/etc/nccl.conf"]);
        // Files that do not exist are not named.
        let f = probe(&Root::at(p.join("cfg")), None, &nccl_conf_files(&[], home));
        assert!(
            f.nccl_conf.is_empty() && f.nccl_conf_files.is_empty(),
            "{f:?}"
        );
    }
}
