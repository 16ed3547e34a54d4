"""artemis.agent"""
