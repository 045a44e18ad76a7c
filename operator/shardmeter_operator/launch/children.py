"""A launch's children, purely: what the recorded launch decision creates, in order
(:func:`children_to_create`: the lighthouse first, then the islands with torchtitan's flags,
rendered by :func:`~shardmeter_operator.render.launch.launch_manifests`), and what creating
them came to (:func:`ensured`: a name conflict, the previous revision still going away, or a
complete launch)."""

from __future__ import annotations

import json

from shardmeter_operator.api import ISLAND_SHAPE, LighthouseStatus, TrainingPlanPhase
from shardmeter_operator.api.conditions import Reason, Type, get_condition, set_condition
from shardmeter_operator.api.errors import FlavorError, RuntimeCannotExpressError, reason_for
from shardmeter_operator.decision import Ensured, PlanInputs, PlanResult, Validated
from shardmeter_operator.launch.workload import launched_message, rendered_pools, used_pools
from shardmeter_operator.render.launch import launch_manifests
from shardmeter_operator.render.lighthouse import islands_address, lighthouse_name, service_type


def children_to_create(inputs: PlanInputs, ok: Validated, out: PlanResult) -> None:
    """The children of the recorded launch decision, in order, into ``out.create`` (the
    lighthouse first, then the islands with torchtitan's flags); none, with ``Launched=False``
    and a recheck, when they cannot be rendered."""
    st = out.status
    assert st.launch is not None
    plan_json = json.dumps(
        {
            "plan": st.plan,
            "islands": [i.model_dump(by_alias=True, include=ISLAND_SHAPE) for i in st.islands],
            "streamingDiLoCo": st.streaming_di_lo_co.model_dump(by_alias=True)
            if st.streaming_di_lo_co
            else None,
            "revision": st.launch.revision,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    sites = st.launch.sites
    ft = ok.spec.fault_tolerance
    address = islands_address(
        inputs.name,
        inputs.namespace,
        ft,
        remote=bool(sites),
        ingress=inputs.cluster.lighthouse_ingress,
    )
    st.lighthouse = (
        LighthouseStatus(address=address, service_type=service_type(ft, bool(sites)))
        if st.streaming_di_lo_co is not None and ok.spec.strategy.is_diloco
        else None
    )
    if not address and st.lighthouse is not None:
        out.withheld = (
            f"waiting for the lighthouse Service {lighthouse_name(inputs.name)} "
            f"({st.lighthouse.service_type}) to get an address the other sites can reach (its "
            "load-balancer ingress), or set spec.faultTolerance.lighthouseAddress; the sites' "
            "JobSets are created then"
        )
    try:
        pools = rendered_pools(
            used_pools(ok.pools, st.islands), st.launch.queue_name, inputs.cluster.flavors
        )
        out.create = launch_manifests(
            inputs.name,
            inputs.namespace,
            inputs.uid,
            ok.spec,
            st,
            pools,
            plan_json=plan_json,
            revision=st.launch.revision,
            bench_image=inputs.cfg.bench_image,
            workload=st.launch.workload,
            queue=st.launch.queue_name,
            restart=st.launch.restart,
            site_queues={s.site: s.queue_name for s in sites} or None,
            lighthouse=address if st.lighthouse is not None else None,
        )
    except (RuntimeCannotExpressError, FlavorError) as exc:  # checked by the decision
        st.conditions = set_condition(
            st.conditions, Type.LAUNCHED, False, reason_for(exc), str(exc), inputs.generation
        )
        out.requeue_within(inputs.cfg.recheck_interval_s)


def ensured(inputs: PlanInputs, result: Ensured, out: PlanResult) -> None:
    """What creating ``out.create`` came to (:func:`~.k8s.children.ensure_children`): a name
    conflict, the previous revision's children still going away, or a complete launch."""
    st, generation = out.status, inputs.generation
    assert st.launch is not None
    st.jobs = [i.name for i in st.islands]  # each island's Job (a JobSet's child Jobs too)
    if result.conflict:
        message = result.conflict
        launched = get_condition(st.conditions, Type.LAUNCHED)
        if launched is None or launched.reason != Reason.NAME_CONFLICT:
            out.events.append(("Warning", Reason.NAME_CONFLICT, message))
        out.requeue_s = inputs.cfg.recheck_interval_s  # resumes once the name is free
        st.conditions = set_condition(
            st.conditions, Type.LAUNCHED, False, Reason.NAME_CONFLICT, message, generation
        )
        return
    if out.withheld and not result.waiting:
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            False,
            Reason.WAITING_FOR_LIGHTHOUSE,
            out.withheld,
            generation,
        )
        out.requeue_within(2.0)
        return
    if result.waiting:
        st.conditions = set_condition(
            st.conditions,
            Type.LAUNCHED,
            False,
            Reason.RELAUNCHING,
            f"waiting for {len(result.waiting)} child(ren) of the previous launch to be deleted: "
            + ", ".join(result.waiting[:5]),
            generation,
        )
        out.requeue_s = 2.0
        return
    st.launch = st.launch.model_copy(update={"complete": True})
    st.phase = TrainingPlanPhase.LAUNCHED
    created, reason = launched_message(st)
    st.conditions = set_condition(st.conditions, Type.LAUNCHED, True, reason, created, generation)
    out.events.append(("Normal", "Launched", f"{created} for {st.plan}"))
