use super::*;
use serde_json::json;

fn node(value: Value) -> Node {
    serde_json::from_value(value).unwrap()
}

#[test]
fn a_node_with_tessera_labels_is_a_machine_with_its_gpus_by_index() {
    let nodes = vec![
        node(json!({
            "node_id": "a1", "node_ip": "10.0.0.7", "state": "ALIVE",
            "labels": {"tessera.machine": "majin", "tessera.gpu-model": "NVIDIA-H200"},
            "resources_total": {
                "CPU": 16.0, "memory": 8_000_000_000.0,
                "tessera_gpu_1_GPU-bbbb": 24576.0, "tessera_gpu_0_GPU-aaaa": 143771.0,
                "node:10.0.0.7": 1.0
            }
        })),
        node(
            json!({"node_id": "b2", "node_ip": "10.0.0.8", "state": "ALIVE", "labels": {}, "resources_total": {"CPU": 4.0}}),
        ),
    ];
    let machines = machines(&nodes);
    assert_eq!(
        machines.len(),
        1,
        "a node without the label is not Tessera's"
    );
    let majin = &machines[0];
    assert_eq!(majin.name, "majin");
    assert_eq!(majin.address, "10.0.0.7");
    assert_eq!(
        majin
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_str()))
            .collect::<Vec<_>>(),
        vec![(0, "GPU-aaaa"), (1, "GPU-bbbb")]
    );
    let machine = majin.machine();
    assert_eq!(machine.cpu_cores, 16);
    assert_eq!(machine.gpus[0].model, "NVIDIA H200");
    assert_eq!(machine.gpus[1].total, Bytes(24576 << 20));
    assert!(machine.gpus.iter().all(|g| g.healthy));
}

#[test]
fn a_machine_whose_node_died_and_came_back_is_the_alive_node() {
    let labels = json!({"tessera.machine": "atlas"});
    let nodes = vec![
        node(json!({"node_id": "new", "node_ip": "10.0.0.9", "state": "ALIVE", "labels": labels})),
        node(json!({"node_id": "old", "node_ip": "10.0.0.1", "state": "DEAD", "labels": labels})),
    ];
    let machines = machines(&nodes);
    assert_eq!(machines.len(), 1);
    assert!(machines[0].alive);
    assert_eq!(machines[0].address, "10.0.0.9");
}

#[test]
fn a_ray_address_must_be_the_dashboards_http_address() {
    assert!(RayClient::new("http://127.0.0.1:8265", None).is_ok());
    assert!(RayClient::new("http://head:8265/", None).is_ok());
    for bad in [
        "127.0.0.1:8265",
        "https://head:8265",
        "http://head",
        "http://head:port",
        "http://head:8265/api",
    ] {
        let error = RayClient::new(bad, None).unwrap_err();
        assert!(
            error.to_string().contains("http://HOST:PORT"),
            "{bad}: {error}"
        );
    }
}

#[test]
fn ray_node_prints_a_start_line_with_the_machines_labels_and_a_resource_per_gpu() {
    let machine = Machine {
        name: "majin".to_owned(),
        gpus: vec![Gpu {
            index: 0,
            uuid: "GPU-aaaa".to_owned(),
            model: "NVIDIA H200".to_owned(),
            vendor: "nvidia".to_owned(),
            total: Bytes(143_771 << 20),
            held_outside: Bytes::ZERO,
            healthy: true,
            mig: None,
        }],
        cpu_cores: 32,
        memory: Bytes::gb(256),
        all_gpus_visible: false,
    };
    assert_eq!(
        start_line(&machine, Some("10.0.0.1:6379")),
        r#"ray start --address=10.0.0.1:6379 --labels=tessera.machine=majin,tessera.gpu-model=NVIDIA-H200 --resources='{"tessera_gpu_0_GPU-aaaa":143771}'"#
    );
    assert!(start_line(&machine, None).starts_with("ray start --head --dashboard-host=0.0.0.0 "));
    let node = node(json!({
        "node_id": "a", "node_ip": "10.0.0.2", "state": "ALIVE",
        "labels": {"tessera.machine": "majin", "tessera.gpu-model": "NVIDIA-H200"},
        "resources_total": {"tessera_gpu_0_GPU-aaaa": 143771.0}
    }));
    let read_back = machines(&[node])[0].machine();
    assert_eq!(
        read_back.gpus[0].total, machine.gpus[0].total,
        "what the line books is what is read back"
    );
    assert_eq!(read_back.gpus[0].model, "NVIDIA H200");
}

#[test]
fn a_nodes_gpu_readings_are_read_from_its_agents_figures_in_mib() {
    let gpus: Vec<AgentGpu> = serde_json::from_value(json!([
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa", "utilizationGpu": 3,
         "memoryUsed": 20480, "memoryTotal": 143771,
         "processesPids": [{"pid": 4242, "gpuMemoryUsage": 18432, "gpuUtilization": null}]},
        {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-bbbb", "utilizationGpu": null,
         "memoryUsed": 0, "memoryTotal": 143771, "processesPids": null}
    ]))
    .unwrap();
    let readings: Vec<GpuReading> = gpus.into_iter().map(AgentGpu::reading).collect();
    assert_eq!(readings[0].used, Bytes(20480 << 20));
    assert_eq!(readings[0].processes, vec![(4242, Bytes(18432 << 20))]);
    assert_eq!(readings[1].processes, vec![]);
    assert_eq!(
        (
            readings[0].utilisation_percent,
            readings[1].utilisation_percent
        ),
        (Some(3), None)
    );
}

#[test]
fn a_node_s_gpu_cut_into_mig_instances_is_offered_as_its_instances_each_with_its_profile() {
    let h100 = |index: u32, uuid: &str, model: &str, mib: u64, mig| Gpu {
        index,
        uuid: uuid.to_owned(),
        model: model.to_owned(),
        vendor: "nvidia".to_owned(),
        total: Bytes(mib << 20),
        held_outside: Bytes::ZERO,
        healthy: true,
        mig,
    };
    let instance = |profile: &str| {
        Some(placement::MigRole::Instance {
            parent: 0,
            profile: profile.to_owned(),
        })
    };
    // As `tessera ray-node` leaves it: the cut GPU gone, its instances in its place.
    let machine = Machine {
        name: "hopper".to_owned(),
        gpus: vec![
            h100(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", 81559, None),
            h100(
                1000,
                "MIG-aaaa",
                "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                40448,
                instance("3g.40gb"),
            ),
            h100(
                1001,
                "MIG-cccc",
                "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                9984,
                instance("1g.10gb"),
            ),
        ],
        cpu_cores: 32,
        memory: Bytes::gb(256),
        all_gpus_visible: false,
    };
    assert_eq!(
        start_line(&machine, Some("10.0.0.1:6379")),
        r#"ray start --address=10.0.0.1:6379 --labels=tessera.machine=hopper,tessera.gpu-model=NVIDIA-H100-80GB-HBM3,tessera.mig.1000=3g.40gb,tessera.mig.1001=1g.10gb --resources='{"tessera_gpu_1000_MIG-aaaa":40448,"tessera_gpu_1001_MIG-cccc":9984,"tessera_gpu_1_GPU-bbbb":81559}'"#
    );
    let node = node(json!({
        "node_id": "h", "node_ip": "10.0.0.3", "state": "ALIVE",
        "labels": {"tessera.machine": "hopper", "tessera.gpu-model": "NVIDIA-H100-80GB-HBM3",
                   "tessera.mig.1000": "3g.40gb", "tessera.mig.1001": "1g.10gb"},
        "resources_total": {"tessera_gpu_1_GPU-bbbb": 81559.0, "tessera_gpu_1000_MIG-aaaa": 40448.0,
                            "tessera_gpu_1001_MIG-cccc": 9984.0}
    }));
    let read_back = machines(&[node])[0].machine();
    let inventory = placement::Inventory::new(vec![read_back.clone()])
        .expect("instances numbered as instances are a consistent inventory");
    assert_eq!(inventory.machines()[0].gpus, machine.gpus);
}
