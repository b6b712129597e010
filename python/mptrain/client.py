"""A small client of the coordinator's Coordinator service (proto/mptrain.proto), for notebooks
and scripts: what trainctl does, with dicts in and out.

    from mptrain import Client
    client = Client()                       # as trainctl: flags -> MPTRAIN_* -> config context
    job = client.submit({"name": "demo", "world_size": 1, "device": "cpu", ...})
    for record in client.watch(job):        # telemetry dicts until the job ends
        print(record["step"], record["loss"])
    client.telemetry_frame(job)             # a pandas DataFrame (pandas installed) or rows

Messages become dicts with the .proto's field names and every field present (defaults too), as
trainctl's JSON; NaN and infinities stay floats.
"""
import random
import time
import uuid

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from . import config as _config
from ._proto import mptrain_pb2 as pb
from ._proto import mptrain_pb2_grpc as pb_grpc

ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


class JobFailed(RuntimeError):
    """watch(..., raise_on_failure=True) of a job that ended FAILED or CANCELLED."""

    def __init__(self, job_id, state, error):
        super().__init__(f"{job_id} {state}: {error}")
        self.job_id, self.state, self.error = job_id, state, error


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_FLOAT = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def _python_values(value, descriptor):
    """JSON's int64 strings as ints, its "NaN"/"Infinity" strings as floats."""
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        convert = None
        if field.type in _INT64:
            convert = int
        elif field.type in _FLOAT:
            convert = float
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            convert = lambda v, d=field.message_type: _python_values(v, d)  # noqa: E731
        if convert is None:
            continue
        value[key] = [convert(v) for v in item] if isinstance(item, list) else convert(item)
    return value


def to_dict(message):
    """A message as a dict: the .proto's field names, every field present (defaults too),
    enums by name, int64 as int, NaN and infinities as floats."""
    return _python_values(
        json_format.MessageToDict(message, preserving_proto_field_name=True,
                                  including_default_value_fields=True), message.DESCRIPTOR)


def _upper_enums(value, descriptor):
    """JobSpec enum values as trainctl takes them: case-insensitive ("cpu" is CPU)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            out[key] = item  # ParseDict names the unknown field.
        elif field.enum_type is not None:
            upper = lambda v: v.upper() if isinstance(v, str) else v  # noqa: E731
            out[key] = [upper(v) for v in item] if isinstance(item, list) else upper(item)
        elif field.message_type is not None:
            nested = field.message_type
            out[key] = ([_upper_enums(v, nested) for v in item] if isinstance(item, list)
                        else _upper_enums(item, nested))
        else:
            out[key] = item
    return out


def spec_from_dict(spec):
    """A JobSpec from the dict a job spec JSON file holds; ValueError naming a bad field."""
    message = pb.JobSpec()
    try:
        json_format.ParseDict(_upper_enums(spec, pb.JobSpec.DESCRIPTOR), message,
                              ignore_unknown_fields=False)
    except json_format.ParseError as error:
        raise ValueError(f"job spec is not valid for JobSpec: {error}") from None
    return message


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token):
        self._token = token

    def __call__(self, context, callback):
        callback((("authorization", "Bearer " + self._token),), None)


class Client:
    """One coordinator. Each argument left None comes from MPTRAIN_<NAME> (MPTRAIN_COORDINATOR,
    MPTRAIN_TLS_CA, ...), else from the config file's context (`context`, else
    $MPTRAIN_CONTEXT, else its current-context), else the default (127.0.0.1:50051,
    plaintext). `token` is the token itself (else `token_file`, else $MPTRAIN_TOKEN).
    `timeout`: each call's deadline in seconds (watch has none)."""

    def __init__(self, coordinator=None, *, context=None, tls_ca=None, tls_cert=None,
                 tls_key=None, tls_server_name=None, token_file=None, token=None, timeout=10.0):
        settings = _config.resolve(context, coordinator=coordinator, tls_ca=tls_ca,
                                   tls_cert=tls_cert, tls_key=tls_key,
                                   tls_server_name=tls_server_name, token_file=token_file)
        self.coordinator = settings["coordinator"]
        self.timeout = timeout
        if token is None:
            token = _config.load_token(settings["token_file"])
        options = [("grpc.max_reconnect_backoff_ms", 1000)]
        if settings["tls_ca"]:
            if bool(settings["tls_cert"]) != bool(settings["tls_key"]):
                raise _config.ConfigError("tls_cert and tls_key go together")
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_config.read_pem("--tls_ca", settings["tls_ca"]),
                private_key=(_config.read_pem("--tls_key", settings["tls_key"])
                             if settings["tls_key"] else None),
                certificate_chain=(_config.read_pem("--tls_cert", settings["tls_cert"])
                                   if settings["tls_cert"] else None))
            if token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.metadata_call_credentials(_BearerToken(token)))
            if settings["tls_server_name"]:
                options.append(("grpc.ssl_target_name_override", settings["tls_server_name"]))
            self._channel = grpc.secure_channel(self.coordinator, credentials, options)
            self._metadata = ()
        else:
            if settings["tls_cert"] or settings["tls_key"]:
                raise _config.ConfigError("tls_cert/tls_key need tls_ca")
            # gRPC refuses call credentials on a plaintext channel: the token goes as metadata.
            self._channel = grpc.insecure_channel(self.coordinator, options)
            self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._stub = pb_grpc.CoordinatorStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        return getattr(self._stub, method)(request, timeout=self.timeout,
                                           metadata=self._metadata)

    def submit(self, spec, request_id=None):
        """Queues the job `spec` (a dict as in a job spec file, or a JobSpec) describes; returns
        its id. A retried submit with the same request_id makes one job."""
        request = pb.SubmitJobRequest(request_id=request_id or f"python-{uuid.uuid4().hex}")
        request.spec.CopyFrom(spec if isinstance(spec, pb.JobSpec) else spec_from_dict(spec))
        return self._call("SubmitJob", request).job_id

    def status(self, job_id):
        """The Job as a dict (state, times, placement, progress, latest telemetry, ...)."""
        return to_dict(self._call("GetJob", pb.GetJobRequest(job_id=job_id)).job)

    def list(self, state=None, labels=None):
        """Every job (or those in `state`, e.g. "running", with every one of `labels`, a
        dict), newest first."""
        request = pb.ListJobsRequest(page_size=500, label_selector=labels or {})
        if state:
            request.state = pb.JobState.Value(state.upper())
        jobs = []
        while True:
            page = self._call("ListJobs", request)
            jobs.extend(to_dict(job) for job in page.jobs)
            if not page.next_page_token:
                break
            request.page_token = page.next_page_token
        jobs.reverse()  # The coordinator pages oldest first.
        return sorted(jobs, key=lambda job: -int(job["submitted_unix_ms"]))

    def cancel(self, *job_ids):
        """Cancels each job; returns {job_id: state}. Raises grpc.RpcError for the first one
        refused (the ones before it are cancelled)."""
        return {job_id: pb.JobState.Name(
                    self._call("CancelJob", pb.CancelJobRequest(job_id=job_id)).state)
                for job_id in job_ids}

    def logs(self, job_id, rank=0, attempt=0):
        """The last part of a rank's output (stdout and stderr) as text."""
        response = self._call("GetRankLog", pb.GetRankLogRequest(job_id=job_id, rank=rank,
                                                                 attempt=attempt))
        return response.data.decode("utf-8", "replace") if isinstance(response.data, bytes) \
            else response.data

    def events(self, job_id):
        """The job's history as the coordinator holds it: every WatchJobEvent dict, oldest
        first, page by page (a running job's: what exists now)."""
        request = pb.GetJobEventsRequest(job_id=job_id, max_events=10000)
        while True:
            response = self._call("GetJobEvents", request)
            for event in response.events:
                request.after_sequence = event.sequence
                yield to_dict(event)
            if response.finished or not response.events:
                return

    def telemetry(self, job_id):
        """Every telemetry record the coordinator holds of the job, as a list of dicts."""
        return [event["telemetry"] for event in self.events(job_id) if "telemetry" in event]

    def telemetry_frame(self, job_id):
        """telemetry() as a pandas DataFrame (one row a record), or the rows where pandas is
        not installed."""
        rows = self.telemetry(job_id)
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)

    # watch()'s reconnection: the first retry after RECONNECT_FIRST_S, doubled up to
    # RECONNECT_MAX_S (each +0-50% jitter, so that many watchers of a restarted coordinator do
    # not come back at once); given up after reconnect_timeout_s without a message.
    RECONNECT_FIRST_S = 0.1
    RECONNECT_MAX_S = 5.0

    def watch(self, job_id, raise_on_failure=False, reconnect_timeout_s=120.0):
        """Yields the job's telemetry records (dicts) as they come, from its first step, until
        it ends; then returns. With raise_on_failure, a job that ended FAILED or CANCELLED
        raises JobFailed (with its error) after its last record. A stream (or the history
        read) broken with UNAVAILABLE — a coordinator restarting, a network blip — is opened
        again with back-off, every record still yielded once; after reconnect_timeout_s
        without an answer the last grpc.RpcError is raised. Other errors raise at once."""
        seen = {}  # attempt -> last step yielded: the history and the stream overlap.
        state, error = None, ""
        delay, broken_since = self.RECONNECT_FIRST_S, None

        def fresh(record):
            if record["step"] <= seen.get(record["attempt"], 0):
                return False
            seen[record["attempt"]] = record["step"]
            return True

        while state not in ENDED:
            stream = self._stub.WatchJob(pb.WatchJobRequest(job_id=job_id),
                                         metadata=self._metadata)
            try:
                for message in stream:
                    delay, broken_since = self.RECONNECT_FIRST_S, None  # An answer: reset.
                    event = to_dict(message)
                    if "snapshot" in event:
                        # What came before the snapshot, from the history: every step from the
                        # start (after a reconnection, what was missed; `fresh` drops repeats).
                        for past in self.events(job_id):
                            if int(past["sequence"]) > int(event["sequence"]):
                                break
                            if "telemetry" in past and fresh(past["telemetry"]):
                                yield past["telemetry"]
                        state, error = event["snapshot"]["state"], event["snapshot"]["error"]
                    elif "telemetry" in event:
                        if fresh(event["telemetry"]):
                            yield event["telemetry"]
                    elif "state_change" in event:
                        state = event["state_change"]["state"]
                        error = event["state_change"]["error"]
                    if state in ENDED:
                        stream.cancel()
                        break
                else:
                    if state not in ENDED:
                        # The coordinator closed the stream early (stopping): as UNAVAILABLE.
                        delay, broken_since = self._reconnect_pause(
                            delay, broken_since, reconnect_timeout_s, None)
            except grpc.RpcError as broken:
                if broken.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                stream.cancel()
                delay, broken_since = self._reconnect_pause(delay, broken_since,
                                                            reconnect_timeout_s, broken)
        if raise_on_failure and state in ("FAILED", "CANCELLED"):
            raise JobFailed(job_id, state, error)

    def _reconnect_pause(self, delay, broken_since, timeout_s, broken):
        """Sleeps before watch()'s next attempt; returns the next (delay, broken_since). Raises
        `broken` (or a RuntimeError) once the stream has been down for timeout_s."""
        now = time.monotonic()
        broken_since = now if broken_since is None else broken_since
        if now - broken_since >= timeout_s:
            if broken is not None:
                raise broken
            raise RuntimeError(f"the watch stream kept closing for {timeout_s:g} s")
        left = max(0.0, timeout_s - (now - broken_since))
        time.sleep(min(delay * (1 + random.random() / 2), left))
        return min(delay * 2, self.RECONNECT_MAX_S), broken_since

    def wait(self, job_id):
        """Blocks until the job ends; returns its final Job dict."""
        for _ in self.watch(job_id):
            pass
        return self.status(job_id)
