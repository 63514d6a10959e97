#!/usr/bin/env python3
"""Regenerates the synthetic hwloc topologies the binding tests load (run from this folder).

Each is an hwloc synthetic machine (lstopo -i DESCRIPTION --of xml) with NVIDIA GPUs (PCI class
0302, vendor 10de) added behind a host bridge under the objects that hold the NUMA nodes, the
way real machines show them: the GPU's locality is its NUMA node's CPUs.
  topo_1numa.xml  1 package, 1 NUMA node, 2 L3, 8 cores x 2 threads (16 CPUs), 2 GPUs
  topo_2numa.xml  2 packages, 1 NUMA node each, 2 L3 each, 4 cores per L3 x 2 (32 CPUs), 4 GPUs
  topo_8numa.xml  2 packages x 4 NUMA nodes, 2 L3 per node, 4 cores per L3 x 2 (128 CPUs), 8 GPUs
  topo_hbm.xml    topo_2numa.xml's CPUs and GPUs, plus NUMA nodes without CPUs: a second one in
                  each package (HBM in flat mode, GPU memory) and one attached to the whole machine
                  (CXL memory); hwloc gives them their parent's CPUs
"""
import subprocess
import xml.etree.ElementTree as ET

MACHINES = {
    "topo_1numa.xml": ("pack:1 numa:1 l3:2 core:4 pu:2", [["0000:3b:00.0", "0000:5e:00.0"]]),
    "topo_2numa.xml": ("pack:2 numa:1 l3:2 core:4 pu:2",
                       [["0000:18:00.0", "0000:3b:00.0"], ["0000:86:00.0", "0000:af:00.0"]]),
    "topo_8numa.xml": ("pack:2 numa:4 l3:2 core:4 pu:2",
                       [["0000:%02x:00.0" % b] for b in (0x01, 0x21, 0x41, 0x61, 0x81, 0xa1, 0xc1, 0xe1)]),
    # Holders in document order: the machine (its CXL node), then each package.
    "topo_hbm.xml": ("[numa] pack:2 [numa] [numa] l3:2 core:4 pu:2",
                     [[], ["0000:18:00.0", "0000:3b:00.0"], ["0000:86:00.0", "0000:af:00.0"]]),
}


def main():
    for name, (desc, gpus_per_node) in MACHINES.items():
        xml = subprocess.run(["lstopo-no-graphics", "-i", desc, "--of", "xml", "-"], check=True,
                             capture_output=True, text=True).stdout
        root = ET.fromstring(xml)
        holders = [o for o in root.iter("object")
                   if any(c.tag == "object" and c.get("type") == "NUMANode" for c in o)]
        gp = 10000
        for holder, gpus in zip(holders, gpus_per_node):
            for bus in gpus:
                bridge = ET.SubElement(holder, "object", {"type": "Bridge", "gp_index": str(gp),
                                                           "bridge_type": "0-1", "depth": "0",
                                                           "bridge_pci": bus[:4] + ":[%s-%s]" % (bus[5:7], bus[5:7])})
                ET.SubElement(bridge, "object", {"type": "PCIDev", "gp_index": str(gp + 1), "pci_busid": bus,
                                                 "pci_type": "0302 [10de:2330] [10de:16c1] a1",
                                                 "pci_link_speed": "0.000000"})
                gp += 2
        for info in root.iter("info"):
            if info.get("name") == "ProcessName":
                info.set("value", "make_topologies.py")
        ET.indent(root, "  ")
        with open(name, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n')
            f.write(ET.tostring(root, encoding="unicode") + "\n")


if __name__ == "__main__":
    main()
