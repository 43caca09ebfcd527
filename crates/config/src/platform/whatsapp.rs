//! `kind = "whatsapp"`: the WhatsApp Cloud API (crates/platforms/src/whatsapp.rs): Meta's
//! webhook on the gateway's own listener in, the Graph API's messages endpoint out.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Bad, KindSettings, PlatformConfig, validate_api_base};
use crate::ConfigError;
use crate::secrets::PlatformSecret;

/// A WhatsApp table's own keys; `token_env` / `token_file` hold the access token (a system
/// user's, bearer on every Graph API call).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Whatsapp {
    /// The business phone number's id (not the number): the sender of every reply and the
    /// credential lock's key. Required.
    #[serde(default)]
    pub phone_number_id: Option<String>,
    /// The Graph API base (default `https://graph.facebook.com`).
    #[serde(default)]
    pub api_base: Option<String>,
    /// The Graph API version (default `v21.0`).
    #[serde(default)]
    pub api_version: Option<String>,
    /// The environment variable holding the app secret that signs the webhook's POSTs
    /// (`X-Hub-Signature-256`).
    #[serde(default)]
    pub app_secret_env: Option<String>,
    /// Or the file holding it.
    #[serde(default)]
    pub app_secret_file: Option<PathBuf>,
    /// The environment variable holding the verify token of the webhook's GET handshake.
    #[serde(default)]
    pub verify_token_env: Option<String>,
    /// Or the file holding it.
    #[serde(default)]
    pub verify_token_file: Option<PathBuf>,
}

impl KindSettings for Whatsapp {
    fn validate(&self, table: &PlatformConfig, bad: &Bad<'_>) -> Result<(), ConfigError> {
        let name = table.adapter_name();
        match self.phone_number_id.as_deref().map(str::trim) {
            None | Some("") => {
                return Err(bad(
                    "phone_number_id",
                    format!(
                        "[[platform]] {name:?} (whatsapp) needs phone_number_id, the id of the business phone number (WhatsApp Manager, API Setup; not the number itself)"
                    ),
                ));
            }
            Some(id) if !id.chars().all(|c| c.is_ascii_digit()) => {
                return Err(bad("phone_number_id", format!("{id:?} is not a phone-number id (digits only)")));
            }
            Some(_) => {}
        }
        if let Some(v) = self.api_version.as_deref()
            && !(v.starts_with('v') && v.len() > 1 && v[1..].chars().all(|c| c.is_ascii_digit() || c == '.'))
        {
            return Err(bad("api_version", format!("{v:?} is not a Graph API version (like \"v21.0\")")));
        }
        crate::one_source(bad, "app_secret", self.app_secret_env.as_deref(), self.app_secret_file.as_deref())?;
        crate::one_source(bad, "verify_token", self.verify_token_env.as_deref(), self.verify_token_file.as_deref())?;
        validate_api_base(bad, self.api_base.as_deref(), false)?;
        if self.api_base.is_none() && !gatewarden_net::TLS {
            return Err(bad(
                "api_base",
                format!("the default https://graph.facebook.com is https, but {}", crate::NO_TLS),
            ));
        }
        for (key, env, file, what) in [
            (
                "app_secret_env",
                &self.app_secret_env,
                &self.app_secret_file,
                "the app secret that signs the webhook (App settings, Basic)",
            ),
            (
                "verify_token_env",
                &self.verify_token_env,
                &self.verify_token_file,
                "the verify token you enter with the webhook's callback URL",
            ),
        ] {
            if env.is_none() && file.is_none() {
                return Err(bad(
                    key,
                    format!(
                        "[[platform]] {name:?} (whatsapp) needs {key}, the environment variable holding {what}, or {}_file",
                        key.trim_end_matches("_env")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn secrets(&self) -> Vec<(PlatformSecret, Option<&str>, Option<&Path>)> {
        vec![
            (PlatformSecret::AppSecret, self.app_secret_env.as_deref(), self.app_secret_file.as_deref()),
            (PlatformSecret::VerifyToken, self.verify_token_env.as_deref(), self.verify_token_file.as_deref()),
        ]
    }

    fn files_mut(&mut self) -> Vec<&mut Option<PathBuf>> {
        vec![&mut self.app_secret_file, &mut self.verify_token_file]
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::Config;

    fn err(own: &str) -> String {
        let text = format!("[[platform]]\nkind = \"whatsapp\"\ntoken_env = \"T\"\n{own}");
        Config::from_toml_str(Path::new("/h/config.toml"), &text).expect_err("must be rejected").to_string()
    }

    const FULL: &str = "phone_number_id = \"106540352242922\"\napp_secret_env = \"S\"\nverify_token_env = \"V\"\n";

    #[test]
    fn required_keys_and_their_words() {
        let ok = format!("[[platform]]\nkind = \"whatsapp\"\ntoken_env = \"T\"\n{FULL}api_version = \"v21.0\"\n");
        let c = Config::from_toml_str(Path::new("/h/config.toml"), &ok).unwrap();
        let w = c.platform[0].own::<super::Whatsapp>().unwrap();
        assert_eq!(w.phone_number_id.as_deref(), Some("106540352242922"));
        assert_eq!(c.platform[0].settings.secrets().len(), 2);
        let e = err("app_secret_env = \"S\"\nverify_token_env = \"V\"\n");
        assert!(e.contains("needs phone_number_id"), "{e}");
        let e = err("phone_number_id = \"+1 555\"\napp_secret_env = \"S\"\nverify_token_env = \"V\"\n");
        assert!(e.contains("digits only"), "{e}");
        let e = err("phone_number_id = \"1\"\nverify_token_env = \"V\"\n");
        assert!(e.contains("needs app_secret_env") && e.contains("app_secret_file"), "{e}");
        let e = err("phone_number_id = \"1\"\napp_secret_env = \"S\"\n");
        assert!(e.contains("needs verify_token_env"), "{e}");
        let e = err(&format!("{FULL}api_version = \"21\"\n"));
        assert!(e.contains("not a Graph API version"), "{e}");
        let e = err(&format!("{FULL}app_secret_file = \"s\"\n"));
        assert!(e.contains("app_secret"), "not both: {e}");
        let e = err(&format!("{FULL}bot_token_env = \"B\"\n"));
        assert!(e.contains("bot_token_env"), "a key of another kind: {e}");
    }
}
