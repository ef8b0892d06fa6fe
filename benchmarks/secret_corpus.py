"""The redaction corpus: fake secrets of many kinds in every event field, and real runs that must not change.

``fake_cases`` generates one :class:`SecretCase` per kind (AWS, GitHub, GitLab, Slack, Stripe, GCP,
PEM and PGP keys, JWTs, URL credentials, ``NAME=value`` assignments, Authorization headers, command
lines, Azure, npm/hf/pypi, Twilio, Docker, JSON credentials, OpenAI/Anthropic, the fleet's own
injected ``TL_TASK_TOKEN`` …). Every secret is random (seeded), never a real one, and its
recognisable prefixes are assembled at run time, so no secret-shaped literal sits in the source.
``corpus_sessions`` places each case in every field an event carries text in (command, tool
arguments JSON, file content, thought, output, agent input, instruction, env-like ``extra`` map,
evaluation details) through ``SessionEmitter``; ``leaks`` says which secrets survive in events.

``real_runs`` imports the recorded third-party runs in ``shared/data/real-trajectories`` (next to
the repository) with ``producers.importers``: nothing in them is a secret, so every change a
redactor makes there is a false positive.
"""

from __future__ import annotations

import base64
import json
import random
import string
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.sdk import Event, SessionEmitter
from schemas import typed

# The recorded third-party runs, beside the repository (``../shared/data/real-trajectories``), or beside the
# directory holding it when the checkout is a worktree one level deeper.
REAL_RUNS_DIR = next(
    (
        candidate
        for parent in Path(__file__).resolve().parents[2:4]
        if (candidate := parent / "shared" / "data" / "real-trajectories").is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "data" / "real-trajectories",
)


@dataclass(frozen=True)
class SecretCase:
    """One fake secret of one kind, in the text it typically appears in.

    Attributes:
        kind: what it is (``aws_sts_json``, ``slack_webhook`` …).
        text: the snippet (a command, a config file, a tool output …) holding the secret.
        secrets: substrings that must not survive redaction (every part of the secret material).
        injected: the values are per-task secrets the host injected (registered with the redactor).
    """

    kind: str
    text: str
    secrets: tuple[str, ...]
    injected: bool = False


class _Fake:
    """Random secret material of the right alphabet and length."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def chars(self, alphabet: str, n: int) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def alnum(self, n: int) -> str:
        # at least one digit, as real random tokens have
        return self.chars(string.ascii_letters + string.digits, n - 1) + self.rng.choice(string.digits)

    def hex(self, n: int) -> str:
        return self.chars("0123456789abcdef", n)

    def upper(self, n: int) -> str:
        return self.chars(string.ascii_uppercase + string.digits, n)

    def b64(self, n: int) -> str:
        return self.chars(string.ascii_letters + string.digits + "+/", n)

    def token(self, n: int) -> str:
        return self.chars(string.ascii_letters + string.digits + "_-", n - 1) + self.rng.choice(string.digits)

    def digits(self, n: int) -> str:
        return self.chars(string.digits, n)

    def password(self) -> str:
        body = self.alnum(self.rng.randint(11, 15))
        cut = self.rng.randint(2, len(body) - 2)
        return body[:cut] + self.rng.choice("-_.%") + body[cut:]

    def pem_lines(self, lines: int = 6) -> list[str]:
        return [self.b64(64) for _ in range(lines)] + [self.b64(24) + "=="]


def _pem(fake: _Fake, label: str) -> tuple[str, tuple[str, ...]]:
    body = fake.pem_lines()
    begin, end = "-----BEGIN " + label + "-----", "-----END " + label + "-----"
    return "\n".join([begin, *body, end]) + "\n", tuple(body)


def _cases(fake: _Fake) -> Iterator[SecretCase]:
    f = fake
    akia, asia = "AK" + "IA" + f.upper(16), "AS" + "IA" + f.upper(16)
    aws_secret = f.b64(40)
    sts_token = "FwoGZXIvYXdzE" + f.b64(180)
    yield SecretCase("aws_access_key_id", f"aws configure set aws_access_key_id {akia}", (akia,))
    yield SecretCase("aws_secret_access_key_env", f"export AWS_SECRET_ACCESS_KEY={aws_secret}", (aws_secret,))
    akia2, secret2 = "AK" + "IA" + f.upper(16), f.b64(40)
    credentials = f"[default]\naws_access_key_id = {akia2}\naws_secret_access_key = {secret2}\nregion = us-east-1\n"
    yield SecretCase("aws_credentials_file", credentials, (akia2, secret2))
    sts = {
        "Credentials": {
            "AccessKeyId": asia,
            "SecretAccessKey": aws_secret[::-1],
            "SessionToken": sts_token,
            "Expiration": "2026-12-01T08:00:00+00:00",
        }
    }
    yield SecretCase("aws_sts_json", json.dumps(sts, indent=4), (asia, aws_secret[::-1], sts_token))
    session_token = "IQoJb3JpZ2lu" + f.b64(200)
    yield SecretCase("aws_session_token_env", f"AWS_SESSION_TOKEN={session_token}", (session_token,))
    akia3, secret3 = "AK" + "IA" + f.upper(16), f.b64(40)
    heredoc = (
        f"cat > ~/.aws/credentials <<'EOF'\n[default]\naws_access_key_id = {akia3}\n"
        f"aws_secret_access_key = {secret3}\nEOF"
    )
    yield SecretCase("aws_credentials_in_json_args", json.dumps({"command": heredoc}), (akia3, secret3))

    ghp, gho, ghs = "gh" + "p_" + f.alnum(36), "gh" + "o_" + f.alnum(36), "gh" + "s_" + f.alnum(36)
    pat = "github" + "_pat_" + f.alnum(22) + "_" + f.alnum(59)
    yield SecretCase("github_ghp", f"echo {ghp} | gh auth login --with-token", (ghp,))
    yield SecretCase("github_gho_hosts_yml", f"github.com:\n    oauth_token: {gho}\n    user: dev\n", (gho,))
    yield SecretCase("github_fine_grained_pat", f"the token is {pat} (expires in 30 days)", (pat,))
    yield SecretCase("github_token_in_url", f"git clone https://x-access-token:{ghs}@github.com/org/repo.git", (ghs,))
    glpat = "gl" + "pat-" + f.token(20)
    yield SecretCase("gitlab_pat", f"glab auth login --hostname gitlab.com --token {glpat}", (glpat,))
    glrt = "gl" + "rt-" + f.token(20)
    yield SecretCase("gitlab_runner_token", f"gitlab-runner register --token {glrt} --url https://gl", (glrt,))

    xoxb = "xo" + "xb-" + f.digits(12) + "-" + f.digits(13) + "-" + f.alnum(24)
    xoxp = "xo" + "xp-" + f.digits(12) + "-" + f.digits(12) + "-" + f.digits(13) + "-" + f.hex(32)
    yield SecretCase("slack_bot_token", f'client = WebClient(token="{xoxb}")', (xoxb,))
    yield SecretCase(
        "slack_user_token", f"curl -F token={xoxp} -F channel=C1 https://slack.com/api/chat.postMessage", (xoxp,)
    )
    hook = "T" + f.upper(8) + "/B" + f.upper(10) + "/" + f.alnum(24)
    url = "https://hooks." + "slack.com/services/" + hook
    yield SecretCase("slack_webhook", f'curl -X POST -d \'{{"text": "deploy done"}}\' {url}', (hook, hook[-24:]))
    discord = f.digits(18) + "/" + f.token(68)
    yield SecretCase("discord_webhook", "POST https://discord.com/api/webhooks/" + discord, (discord[-68:],))

    sk_live, rk_live = "sk" + "_live_" + f.alnum(24), "rk" + "_live_" + f.alnum(24)
    yield SecretCase("stripe_secret_key", f"stripe.api_key = '{sk_live}'", (sk_live,))
    yield SecretCase("stripe_restricted_key", f"STRIPE_RESTRICTED={rk_live} node charge.js", (rk_live,))
    whsec = "wh" + "sec_" + f.alnum(32)
    yield SecretCase("stripe_webhook_secret", f"endpoint_secret = '{whsec}'", (whsec,))

    key_id = f.hex(40)
    pkcs8, pkcs8_lines = _pem(f, "PRIVATE" + " KEY")
    service_account = {
        "type": "service_account",
        "project_id": "demo-proj",
        "private_key_id": key_id,
        "private_key": pkcs8,
        "client_email": "svc@demo-proj.iam.gserviceaccount.com",
        "client_id": f.digits(21),
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    yield SecretCase("gcp_service_account_json", json.dumps(service_account, indent=2), (key_id, *pkcs8_lines))
    for kind, label in (
        ("pem_rsa", "RSA PRIVATE KEY"),
        ("pem_ec", "EC PRIVATE KEY"),
        ("pem_openssh", "OPENSSH PRIVATE KEY"),
        ("pem_pkcs8", "PRIVATE KEY"),
        ("pem_encrypted_pkcs8", "ENCRYPTED PRIVATE KEY"),
    ):
        text, lines = _pem(f, label.replace("PRIVATE KEY", "PRIVATE" + " KEY"))
        yield SecretCase(kind, f"$ cat ~/.ssh/id_{kind}\n{text}", lines)
    pgp_body = f.pem_lines(8)
    pgp = "\n".join(
        [
            "-----BEGIN PGP PRIVATE" + " KEY BLOCK-----",
            "",
            *pgp_body,
            "=" + f.b64(4),
            "-----END PGP PRIVATE" + " KEY BLOCK-----",
        ]
    )
    yield SecretCase(
        "pgp_private_key_block", "gpg --export-secret-keys --armor dev@example.com\n" + pgp, tuple(pgp_body)
    )

    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    claims = base64.urlsafe_b64encode(json.dumps({"sub": f.digits(8), "exp": 1893456000}).encode()).decode()
    jwt = f"{header}.{claims.rstrip('=')}.{f.token(43)}"
    yield SecretCase("jwt", f"Cookie: theme=dark; session={jwt}", (jwt, jwt.split(".")[2]))

    pw = [f.password() for _ in range(24)]
    yield SecretCase("redis_url_password", f"redis-cli -u redis://:{pw[0]}@cache.internal:6379/0 ping", (pw[0],))
    yield SecretCase("postgres_url", f"DATABASE_URL=postgres://app:{pw[1]}@db.internal:5432/app", (pw[1],))
    yield SecretCase(
        "mysql_url", f"engine = create_engine('mysql+pymysql://root:{pw[2]}@127.0.0.1:3306/shop')", (pw[2],)
    )
    yield SecretCase(
        "mongodb_srv_url", f"mongosh 'mongodb+srv://admin:{pw[3]}@cluster0.ab1cd.mongodb.net/test'", (pw[3],)
    )
    yield SecretCase("db_pass_env", f"DB_PASS={pw[4]}", (pw[4],))
    service_token = f.alnum(32)
    yield SecretCase("generic_token_env", f"export SERVICE_TOKEN={service_token}", (service_token,))
    yield SecretCase("password_env", f"MYSQL_ROOT_PASSWORD={pw[5]} docker compose up -d", (pw[5],))
    yield SecretCase("pgpassword_env", f"PGPASSWORD={pw[6]} psql -h db -U app -c 'select 1'", (pw[6],))
    sendgrid = "S" + "G." + f.token(22) + "." + f.token(43)
    yield SecretCase("sendgrid", f"sg = SendGridAPIClient('{sendgrid}')", (sendgrid,))

    bearer = f.alnum(40)
    yield SecretCase(
        "authorization_bearer", f'curl -H "Authorization: Bearer {bearer}" https://api.example.com/v1', (bearer,)
    )
    token_hex = f.hex(40)
    yield SecretCase("authorization_token", f"Authorization: token {token_hex}", (token_hex,))
    basic = base64.b64encode(f"deploy:{pw[7]}".encode()).decode()
    yield SecretCase("authorization_basic", f"GET /private HTTP/1.1\nHost: x\nAuthorization: Basic {basic}\n", (basic,))
    yield SecretCase("curl_user_password", f"curl -u deploy:{pw[8]} https://ci.example.com/api/json", (pw[8],))
    yield SecretCase("mysql_p_password", f"mysql -h db -u root -p{pw[9]} shop < dump.sql", (pw[9],))
    yield SecretCase("sshpass", f"sshpass -p '{pw[10]}' ssh deploy@host uptime", (pw[10],))
    yield SecretCase("redis_cli_a", f"redis-cli -h cache -a {pw[11]} ping", (pw[11],))
    yield SecretCase("docker_login_password", f"docker login -u ci --password {pw[12]} registry.example.com", (pw[12],))
    yield SecretCase("netrc", f"machine api.example.com login deploy password {pw[13]}", (pw[13],))
    yield SecretCase("yaml_password", f"database:\n  host: db\n  user: app\n  password: {pw[14]}\n", (pw[14],))
    yield SecretCase("git_credentials_url", f"https://deploy:{pw[15]}@gitlab.example.com\n", (pw[15],))

    account_key = f.b64(86) + "=="
    azure = (
        f"AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=https;AccountName=acct{f.digits(4)};"
        f"AccountKey={account_key};EndpointSuffix=core.windows.net'"
    )
    yield SecretCase("azure_account_key", azure, (account_key, account_key[:40]))
    sig = f.b64(43) + "="
    sas = (
        "https://acct.blob.core.windows.net/data/file.csv?sv=2022-11-02&ss=b&srt=o&sp=r"
        f"&se=2026-12-31T00:00:00Z&spr=https&sig={urllib.parse.quote(sig, safe='')}"
    )
    yield SecretCase(
        "azure_sas_sig", f"az storage blob download --blob-url '{sas}'", (urllib.parse.quote(sig, safe=""),)
    )

    npm = "np" + "m_" + f.alnum(36)
    yield SecretCase("npmrc_auth_token", f"//registry.npmjs.org/:_authToken={npm}", (npm,))
    npm2 = "np" + "m_" + f.alnum(36)
    yield SecretCase("npm_token_bare", f"publishing with {npm2}", (npm2,))
    hf = "h" + "f_" + f.alnum(34)
    yield SecretCase("huggingface_token_bare", f"Using {hf} to download the model", (hf,))
    pypi = "py" + "pi-" + "AgEIcHlwaS5vcmc" + f.token(70)
    yield SecretCase("pypi_token_bare", f"{pypi}\n", (pypi,))

    twilio_sk, twilio_secret = "S" + "K" + f.hex(32), f.alnum(32)
    yield SecretCase(
        "twilio_api_key",
        f"twilio api:core:messages:list --api-key {twilio_sk} --api-secret {twilio_secret}",
        (twilio_sk, twilio_secret),
    )
    twilio_ac, twilio_auth = "A" + "C" + f.hex(32), f.hex(32)
    yield SecretCase(
        "twilio_account_auth_token",
        f"curl -X GET https://api.twilio.com/2010-04-01/Accounts.json -u {twilio_ac}:{twilio_auth}",
        (twilio_ac, twilio_auth),
    )
    twilio_env = f.hex(32)
    yield SecretCase("twilio_auth_token_env", f"TWILIO_AUTH_TOKEN={twilio_env}", (twilio_env,))

    docker_auth = base64.b64encode(f"ci:{pw[16]}".encode()).decode()
    docker = json.dumps({"auths": {"registry.example.com": {"auth": docker_auth}}}, indent=2)
    yield SecretCase("docker_config_auth", docker, (docker_auth,))
    api_key = f.alnum(32)
    yield SecretCase("json_api_key", json.dumps({"api_key": api_key, "model": "m1"}), (api_key,))
    yield SecretCase("json_password", json.dumps({"username": "svc", "password": pw[17]}), (pw[17],))
    client_secret = f.token(40)
    yield SecretCase(
        "json_client_secret", json.dumps({"client_id": "web-app", "client_secret": client_secret}), (client_secret,)
    )

    openai = "s" + "k-" + f.alnum(48)
    yield SecretCase("openai_key", f"OPENAI_KEY='{openai}' python run.py", (openai,))
    project = "s" + "k-proj-" + f.token(120)
    yield SecretCase("openai_project_key", f'client = OpenAI(api_key="{project}")', (project,))
    anthropic = "s" + "k-ant-api03-" + f.token(93) + "AA"
    yield SecretCase("anthropic_key", f"export ANTHROPIC_API_KEY={anthropic}", (anthropic,))

    task_token = f.hex(32)
    yield SecretCase("fleet_task_token_alone", f"{task_token}\n", (task_token,), injected=True)
    task_token2 = f.hex(32)
    yield SecretCase(
        "fleet_task_token_in_text", f"the run token{task_token2}was printed", (task_token2,), injected=True
    )
    task_token3 = f.hex(32)
    yield SecretCase(
        "fleet_task_env_file",
        f"$ cat /run/secrets/task.env\nTL_TASK_TOKEN={task_token3}\n",
        (task_token3,),
        injected=True,
    )

    google = "AI" + "za" + f.token(35)
    yield SecretCase(
        "google_api_key_in_url",
        f"https://maps.googleapis.com/maps/api/geocode/json?address=Paris&key={google}",
        (google,),
    )
    ya29 = "ya" + "29." + f.token(120)
    yield SecretCase("gcp_oauth_access_token", f"$ gcloud auth print-access-token\n{ya29}\n", (ya29,))
    api_key2 = f.alnum(32)
    yield SecretCase("dotenv_api_key", f"API_KEY={api_key2}\nDEBUG=false\n", (api_key2,))
    access = f.alnum(40)
    yield SecretCase("query_access_token", f"GET /v1/me?access_token={access}&fields=id,name HTTP/1.1", (access,))
    x_api = f.alnum(32)
    yield SecretCase("x_api_key_header", f"curl -H 'X-API-Key: {x_api}' https://api.example.com/items", (x_api,))
    dapi = "da" + "pi" + f.hex(32)
    yield SecretCase("databricks_token", f"databricks configure --token\nToken: {dapi}\n", (dapi,))
    dop = "do" + "p_v1_" + f.hex(64)
    yield SecretCase("digitalocean_token", f"doctl auth init -t {dop}", (dop,))
    shpat = "sh" + "pat_" + f.hex(32)
    yield SecretCase("shopify_token", f"X-Shopify-Access-Token: {shpat}", (shpat,))
    literal = f.alnum(32)
    yield SecretCase("python_api_key_literal", f'api_key = "{literal}"\nclient = Client(api_key)\n', (literal,))
    kube = f.token(40)
    yield SecretCase("kubeconfig_token", f"users:\n- name: admin\n  user:\n    token: {kube}\n", (kube,))
    yield SecretCase("password_flag", f"psql --password={pw[18]} -h db", (pw[18],))


def fake_cases(seed: int = 0) -> list[SecretCase]:
    """One fake secret per kind (deterministic for a seed)."""
    cases = list(_cases(_Fake(random.Random(seed))))
    assert len({c.kind for c in cases}) == len(cases), "kinds must be distinct"
    return cases


def _json_escaped(text: str) -> str:
    return json.dumps(text)[1:-1]


# Surroundings the cases were not written in, for a recall figure less tied to how the corpus was written:
# (how the text is wrapped, how a secret looks once wrapped).
CONTEXTS: dict[str, tuple[Callable[[str], str], Callable[[str], str]]] = {
    "json_escaped": (lambda t: "print(" + json.dumps(t) + ")", _json_escaped),
    "code_fence": (lambda t: "Here is the output:\n```\n" + t + "\n```\nDone.", str),
    "crlf": (lambda t: t.replace("\n", "\r\n"), str),
    "indented": (lambda t: "\n".join("    " + line for line in t.split("\n")), str),
    "shell_prompt": (lambda t: "$ " + t + " 2>&1 | tee run.log", str),
    "html_pre": (lambda t: "<pre>" + t.replace("&", "&amp;") + "</pre>", lambda x: x.replace("&", "&amp;")),
}


def in_context(case: SecretCase, context: str) -> SecretCase:
    """``case`` wrapped in one of ``CONTEXTS``, with its secrets as they look there."""
    wrap, look = CONTEXTS[context]
    return SecretCase(case.kind, wrap(case.text), tuple(look(s) for s in case.secrets), case.injected)


# Every field an event carries free text in, and how a case's text gets there.
FIELDS: tuple[str, ...] = (
    "command",
    "arguments",
    "file_content",
    "thought",
    "output",
    "agent_input",
    "instruction",
    "env",
    "details",
)


def _session(events: list[Event], session_id: str, instruction: str) -> SessionEmitter:
    emitter = SessionEmitter(
        events.append,
        session_id=session_id,
        task_id="corpus",
        task_type="redaction",
        sandbox_id="sb-corpus",
        image_name="corpus",
        image_version="1",
        id_factory=_counter(session_id),
        clock=lambda: 1_767_225_600_000_000,
    )
    emitter.start(
        cpu_limit=1.0,
        memory_limit_bytes=1 << 30,
        pids_limit=64,
        timeout_s=600.0,
        network_enabled=False,
        config_digest="corpus",
        instruction=instruction,
    )
    return emitter


def _counter(prefix: str) -> Callable[[], str]:
    state = iter(range(1 << 30))
    return lambda: f"{prefix}-{next(state)}"


def place(case: SecretCase, field: str) -> list[Event]:
    """The events of a short session whose ``field`` holds ``case.text`` (every other field is ordinary)."""
    text = case.text
    events: list[Event] = []
    emitter = _session(events, f"{case.kind}-{field}", text if field == "instruction" else "Fix the failing test.")
    if field == "agent_input":
        emitter.agent_input(prompt_digest="d", input_tokens=10, content=text)
    if field == "command":
        action = emitter.action("bash", command=text, thought="Run it.")
    elif field == "arguments":
        action = emitter.action("deploy", arguments={"script": text, "dry_run": False, "retries": 2})
    elif field == "file_content":
        action = emitter.action("write_file", arguments={"path": "config/.env", "content": text})
    elif field == "thought":
        action = emitter.action("bash", command="ls -la", thought=text)
    else:
        action = emitter.action("bash", command="cat notes.txt", thought="Look at the notes.")
    output = text if field == "output" else "ok"
    feedback: typed.EnvFeedback = {
        "tool_call_id": "",
        "output": output,
        "output_bytes": len(output.encode()),
        "exit_code": 0,
        "duration_ms": 5.0,
    }
    extra = {"env": text} if field == "env" else None
    emitter.emit("env_feedback", feedback, "environment", parent_event_id=action, extra=extra)
    if field == "details":
        emitter.evaluation(
            passed=False,
            tests_total=1,
            tests_passed=0,
            reward=0.0,
            fresh_sandbox=True,
            evaluator="corpus",
            duration_ms=1.0,
            details=text,
        )
    emitter.end(status="completed", runtime_s=1.0)
    return events


def strings_of(value: Any) -> Iterator[str]:
    """Every string inside an event (keys too), and the strings inside JSON-valued strings, unescaped."""
    if isinstance(value, str):
        yield value
        stripped = value.strip()
        if stripped[:1] in "{[":
            try:
                yield from strings_of(json.loads(stripped))
            except ValueError:
                pass
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings_of(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_of(item)


def leaks(case: SecretCase, events: list[Event]) -> list[str]:
    """The secrets of ``case`` still present anywhere in ``events``."""
    texts = list(strings_of(events))
    return [secret for secret in case.secrets if any(secret in text for text in texts)]


def corpus_sessions(cases: list[SecretCase]) -> Iterator[tuple[SecretCase, str, list[Event]]]:
    """Every case in every field: ``(case, field, events)``."""
    for case in cases:
        for field in FIELDS:
            yield case, field, place(case, field)


def injected_values(cases: list[SecretCase]) -> list[str]:
    """The values the fleet injected (what a host registers with ``register_secret_values``)."""
    return [secret for case in cases if case.injected for secret in case.secrets]


def real_run_files(root: Path = REAL_RUNS_DIR) -> list[Path]:
    """The recorded runs under ``root`` (``.traj``, ``.json``, ``.jsonl``; not manifests or reports)."""
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name.endswith((".traj", ".json", ".jsonl"))
        and p.name != "manifest.json"
        and not p.name.endswith(".report.json")
    )


def real_runs(root: Path = REAL_RUNS_DIR) -> tuple[list[list[Event]], list[str]]:
    """The events of every recorded run under ``root``, imported as ``trajlake import`` does but not redacted.

    Returns:
        The runs' events, and the files the importers cannot read (with the reason), which are left out.
    """
    from producers.importers import ImportFormatError, import_trajectory

    runs, skipped = [], []
    for path in real_run_files(root):
        try:
            runs.append(import_trajectory(path, redact=False))
        except ImportFormatError as exc:
            skipped.append(f"real run not importable, left out: {exc}")
    return runs, skipped


def real_run_strings(root: Path = REAL_RUNS_DIR) -> list[str]:
    """Every string in the recorded runs' files as recorded (model responses, histories and configs
    the importers do not carry over included): a wider must-not-change side than the imported events."""
    strings: list[str] = []
    for path in real_run_files(root):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines() if path.suffix == ".jsonl" else [text]
        for line in lines:
            if line.strip():
                strings.extend(s for s in strings_of(json.loads(line)) if s)
    return strings
